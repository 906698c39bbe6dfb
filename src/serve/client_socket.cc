#include "serve/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace npurt::serve {
namespace {

// The numeric host and port of `a`, as cpp-httplib writes them into a Request.
bool address_is(const sockaddr_storage& a, const std::string& host, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  int got_port = -1;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof(text));
    got_port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof(text));
    got_port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  return got_port == port && host == text;
}

bool connects(int fd, const std::string& remote_addr, int remote_port, const std::string& local_addr,
              int local_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage peer{}, self{};
  socklen_t peer_len = sizeof(peer), self_len = sizeof(self);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) return false;
  return address_is(peer, remote_addr, remote_port) && address_is(self, local_addr, local_port);
}

}  // namespace

ClientSocket ClientSocket::find(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                                int local_port) {
  ClientSocket found;
  if (remote_port < 0 || local_port < 0) return found;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return found;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (connects(static_cast<int>(fd), remote_addr, remote_port, local_addr, local_port)) {
      found.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool ClientSocket::gone() const {
  if (fd_ < 0) return false;
  pollfd p{.fd = fd_, .events = POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace npurt::serve
