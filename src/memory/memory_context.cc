#include "npurt/memory/memory_context.h"

#include "memory/memory_core.h"

namespace npurt {

StatusOr<std::unique_ptr<MemoryContext>> MemoryContext::create(std::shared_ptr<hal::Device> device,
                                                               MemoryOptions options) {
  if (!device) return invalid_argument("MemoryContext: no device");
  auto core = std::make_shared<memory_detail::MemoryCore>(std::move(device), options);
  NPURT_RETURN_IF_ERROR(core->open().with_context("creating the memory context's transfer streams"));
  return std::unique_ptr<MemoryContext>(new MemoryContext(std::move(core)));
}

MemoryContext::MemoryContext(std::shared_ptr<memory_detail::MemoryCore> core)
    : core_(std::move(core)) {}

MemoryContext::~MemoryContext() { close(); }

void MemoryContext::close() { core_->close(); }

const MemoryOptions& MemoryContext::options() const { return core_->options(); }
hal::Device& MemoryContext::device() const { return core_->device(); }

StatusOr<Buffer> MemoryContext::create_buffer(uint64_t bytes, BufferOptions options) {
  return core_->create_buffer(bytes, options);
}

StatusOr<ReadGuard> MemoryContext::read(const View& view) { return core_->read(view); }
StatusOr<WriteGuard> MemoryContext::write(const View& view) { return core_->write(view, true); }
StatusOr<WriteGuard> MemoryContext::overwrite(const View& view) {
  return core_->write(view, false);
}
Status MemoryContext::mark_host_written(const View& view) { return core_->mark_host_written(view); }
Status MemoryContext::to_device(const View& view) { return core_->to_device(view); }
Status MemoryContext::to_host(const View& view) { return core_->to_host(view); }
Status MemoryContext::drop_host_copy(const View& view) { return core_->drop_host_copy(view); }
Status MemoryContext::retain_until_exit(const View& view) { return core_->retain_until_exit(view); }

Status MemoryContext::launch(hal::StreamId stream, const exec::CodeHandle& code, uint32_t grid,
                             std::span<const LaunchArg> args) {
  return core_->launch(stream, code, grid, args);
}
StatusOr<LaunchPlan> MemoryContext::plan_launch(hal::StreamId stream, const isa::Image& image,
                                                uint32_t grid, std::span<const LaunchArg> args) {
  return core_->plan_launch(stream, image, grid, args);
}

Status MemoryContext::enqueue_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args,
                                      const EnqueueCommand& enqueue) {
  return core_->enqueue_command(stream, name, args, enqueue);
}

Status MemoryContext::synchronize() { return core_->synchronize(); }
MemoryStats MemoryContext::stats() const { return core_->stats(); }

}  // namespace npurt
