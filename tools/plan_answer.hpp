// plan_answer.hpp: `tensorpool plan`'s answer in words, and where the bytes go at the peak.
//
// A plan leads with a short answer (what fits, with which micro-batch and accumulation, for
// which allocators and for PyTorch's default; or why nothing can: the model states alone against
// the card), then the tables (plan.cpp). "Where the bytes go" sums, at the moment a generated
// trace's live requested bytes peak, the bytes of each kind of tensor, from the generator's labels
// (src/workload/training.cpp names every allocation KIND:NAME).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan.hpp"
#include "tensorpool/trace/event.hpp"

namespace tensorpool::cli {

/// The live requested bytes of one device of a trace at their peak, by kind of tensor.
struct PeakBreakdown {
  struct Part {
    std::string kind;  // "weights", "gradients", "optimizer states", "activations", ...
    std::size_t bytes = 0;
  };
  int device = 0;
  std::size_t peak = 0;     // == the sum of parts
  std::vector<Part> parts;  // every kind, in a fixed order (model states first)

  /// Weights, gradients and optimizer states: what the model needs before any activation.
  std::size_t model_states() const;
};

/// The breakdown of the device (pipeline stage) whose live requested bytes peak highest.
PeakBreakdown breakdown_at_peak(const trace::Trace& trace);

/// "model states 23.20 GiB (weights 2.90, gradients 2.90, optimizer states 17.40), activations
/// ..." (kinds with no bytes left out).
std::string breakdown_text(const PeakBreakdown& b);
nlohmann::json breakdown_json(const PeakBreakdown& b);

/// The answer's facts: the micro-batch it recommends (if any), the breakdowns at it and at the
/// first micro-batch that does not fit.
struct PlanAnswer {
  std::string text;                 // a few sentences, ending in a newline
  std::optional<std::uint64_t> micro_batch;  // the largest any allocator fits
  std::optional<PeakBreakdown> at_answer;    // at micro_batch
  std::optional<std::uint64_t> next_micro_batch;  // the first that does not fit (any allocator)
  std::optional<PeakBreakdown> at_next;
};

PlanAnswer plan_answer(const PlanReport& report);
nlohmann::json answer_json(const PlanAnswer& answer);

}  // namespace tensorpool::cli
