#include "npurt/comm/collective_steps.h"

#include <algorithm>
#include <cstring>

namespace npurt::comm {

using isa::Access;
using isa::ArgSpec;
using isa::DType;

namespace {
constexpr char kRows[] = "rows";
}

AllReduceStep::AllReduceStep(std::shared_ptr<Communicator> comm, DType dtype, uint64_t elements, uint64_t row_elems)
    : CollectiveStep(std::move(comm), dtype, elements), row_elems_(row_elems) {}

std::string AllReduceStep::name() const {
  return "all_reduce " + std::string(isa::dtype_name(dtype_)) + " " + std::to_string(elements_) +
         (row_elems_ ? " (runtime rows of " + std::to_string(row_elems_) + ")" : "");
}

Status AllReduceStep::validate() const {
  if (!comm_) return ops::invalid_param("all_reduce", "comm", "is null");
  if (reduce_element_bytes(dtype_) == 0) return ops::invalid_param("all_reduce", "dtype", "must be f32 or bf16");
  if (elements_ == 0) return ops::invalid_param("all_reduce", "elements", "must be positive");
  if (row_elems_ && elements_ % row_elems_ != 0) return ops::invalid_param("all_reduce", "row_elems", "must divide elements");
  return ok_status();
}

std::vector<ArgSpec> AllReduceStep::signature() const {
  std::vector<ArgSpec> s{ArgSpec::buffer("data", Access::kInOut, dtype_, elements_)};
  if (row_elems_) s.push_back(ArgSpec::scalar(kRows, DType::kI32));
  return s;
}

Status AllReduceStep::enqueue(hal::StreamId stream, std::span<const LaunchArg> args) const {
  View data = args[0].view();
  if (row_elems_) {
    const int64_t rows = static_cast<int64_t>(args[1].scalar_bits());
    const int64_t most = static_cast<int64_t>(elements_ / row_elems_);
    if (rows < 1 || rows > most) {
      return invalid_argument(name() + ": scalar 'rows' " + std::to_string(rows) + " is outside [1, " +
                              std::to_string(most) + "]");
    }
    NPURT_ASSIGN_OR_RETURN(data, data.subview(0, rows * row_elems_ * reduce_element_bytes(dtype_)));
  }
  return comm_->all_reduce(stream, data, dtype_);
}

void AllReduceStep::compute_reference(std::span<const ops::HostArg>) const {}  // one rank: the sum is its data

std::string AllGatherStep::name() const {
  return "all_gather " + std::string(isa::dtype_name(dtype_)) + " " + std::to_string(elements_);
}

Status AllGatherStep::validate() const {
  if (!comm_) return ops::invalid_param("all_gather", "comm", "is null");
  if (elements_ == 0) return ops::invalid_param("all_gather", "elements", "must be positive");
  if (isa::dtype_is_quantized(dtype_)) return ops::invalid_param("all_gather", "dtype", "must be a plain type");
  return ok_status();
}

std::vector<ArgSpec> AllGatherStep::signature() const {
  return {ArgSpec::buffer("local", Access::kIn, dtype_, elements_),
          ArgSpec::buffer("gathered", Access::kOut, dtype_, elements_ * comm_->size())};
}

Status AllGatherStep::enqueue(hal::StreamId stream, std::span<const LaunchArg> args) const {
  return comm_->all_gather(stream, args[0].view(), args[1].view());
}

void AllGatherStep::compute_reference(std::span<const ops::HostArg> args) const {
  const std::span<uint8_t> local = args[0].bytes, gathered = args[1].bytes;
  std::fill(gathered.begin(), gathered.end(), 0);
  std::copy(local.begin(), local.end(), gathered.begin() + comm_->rank() * local.size());
}

}  // namespace npurt::comm
