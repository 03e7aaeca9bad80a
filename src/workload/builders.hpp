// builders.hpp: the trace builders behind generate_workload() (internal to tensorpool::workload):
// training.cpp, torch_loop.cpp and inference.cpp. Each takes a validated setup.
#pragma once

#include "tensorpool/trace/event.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tensorpool::workload {

trace::Trace generate_training_trace(const WorkloadSetup& setup);  // framework:megatron
trace::Trace generate_torch_trace(const WorkloadSetup& setup);     // framework:pytorch (training, forward)
trace::Trace generate_inference_trace(const WorkloadSetup& setup);

}  // namespace tensorpool::workload
