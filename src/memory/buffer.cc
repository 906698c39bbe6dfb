#include "npurt/memory/buffer.h"

#include "memory/memory_core.h"

namespace npurt {
namespace {

const std::string& empty_name() {
  static const std::string name;
  return name;
}

}  // namespace

// ---- View ----------------------------------------------------------------------------

const std::string& View::buffer_name() const { return buffer_ ? buffer_->name : empty_name(); }

uint8_t* View::data() const { return buffer_ ? buffer_->mirror + offset_ : nullptr; }

StatusOr<View> View::subview(uint64_t offset, uint64_t length) const {
  if (!buffer_) return failed_precondition("subview of a view that is not attached to a buffer");
  if (offset > size_ || length > size_ - offset) {
    return out_of_range("view [" + std::to_string(offset_ + offset) + ", +" +
                        std::to_string(length) + ") does not fit in [" + std::to_string(offset_) +
                        ", " + std::to_string(offset_ + size_) + ") of buffer '" + buffer_->name +
                        "'");
  }
  return View(buffer_, offset_ + offset, length);
}

// ---- Buffer --------------------------------------------------------------------------

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    free().ignore();
    state_ = std::move(other.state_);
  }
  return *this;
}

Buffer::~Buffer() { free().ignore(); }

uint64_t Buffer::size() const { return state_ ? state_->size : 0; }
const std::string& Buffer::name() const { return state_ ? state_->name : empty_name(); }
hal::DeviceAddr Buffer::device_address() const { return state_ ? state_->device_addr : hal::DeviceAddr{}; }
uint8_t* Buffer::host_data() const { return state_ ? state_->mirror : nullptr; }
bool Buffer::tracked() const { return state_ && state_->tracked.load(std::memory_order_relaxed); }

View Buffer::view() const {
  if (!state_) return View();
  return View(state_, 0, state_->size);
}

StatusOr<View> Buffer::view(uint64_t offset, uint64_t length) const {
  if (!state_) return failed_precondition("view of an empty Buffer");
  return view().subview(offset, length);
}

Status Buffer::enable_tracking(WriteTrackingMechanism mechanism) {
  if (!state_) return failed_precondition("enable_tracking on an empty Buffer");
  return state_->core->enable_tracking(*state_, mechanism);
}

Status Buffer::free() {
  if (!state_) return ok_status();
  std::shared_ptr<memory_detail::BufferState> state = std::move(state_);
  return state->core->free_buffer(*state);
}

}  // namespace npurt
