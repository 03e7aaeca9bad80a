// builders.hpp: the trace builders behind generate_workload() (internal to tensorpool::workload):
// training.cpp and inference.cpp. Both take a validated setup.
#pragma once

#include "tensorpool/trace/event.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tensorpool::workload {

trace::Trace generate_training_trace(const WorkloadSetup& setup);
trace::Trace generate_inference_trace(const WorkloadSetup& setup);

}  // namespace tensorpool::workload
