// plan_page.hpp: `tensorpool plan --report FILE`: the plan as one self-contained HTML page (no
// script, no external resource): the answer in words, and where the bytes go at the peak as
// stacked bars (per kind of tensor, then each fitting allocator's fragmentation and cache on top),
// against the device's capacity, for the answer's micro-batch and for the first that does not fit.
#pragma once

#include <string>

#include "plan.hpp"
#include "plan_answer.hpp"

namespace tensorpool::cli {

std::string plan_page(const PlanReport& report, const PlanAnswer& answer);

}  // namespace tensorpool::cli
