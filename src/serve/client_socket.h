// ClientSocket: the socket of the connection a request came on, found by its two
// addresses, so a handler that answers in one piece sees the client go away while the
// answer is computed. cpp-httplib (0.11) gives handlers neither the socket nor a
// closed-connection signal; streamed answers notice from their failed writes instead.
#pragma once

#include <string>

namespace npurt::serve {

class ClientSocket {
 public:
  // The socket of this process connected from remote_addr:remote_port to
  // local_addr:local_port; none when no such socket is open (gone() is then false).
  static ClientSocket find(const std::string& remote_addr, int remote_port, const std::string& local_addr,
                           int local_port);

  // Whether the client closed its side or the connection failed. The socket stays the
  // server's while the handler runs, so its number cannot be reused meanwhile.
  bool gone() const;

 private:
  int fd_ = -1;
};

}  // namespace npurt::serve
