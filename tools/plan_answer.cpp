// plan_answer.cpp: the plan's answer in words and the breakdown of the peak (plan_answer.hpp).
#include "plan_answer.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "tensorpool/types.hpp"
#include "tensorpool/workload/setup.hpp"

namespace tensorpool::cli {

namespace {

// The kinds, in the order they are shown, and the label prefixes (before ':') of each.
struct Kind {
  std::string_view name;
  std::array<std::string_view, 4> prefixes;
};
constexpr std::array<Kind, 9> kKinds = {{
    {"weights", {"weights"}},
    {"gradients", {"grads"}},
    {"optimizer states", {"optimizer"}},
    {"activations", {"activations", "recompute", "inputs", "pipeline"}},
    {"autocast casts", {"autocast"}},
    {"loss", {"loss"}},
    {"temporaries", {"temporaries"}},
    {"ZeRO buffers", {"zero"}},
    {"other", {}},
}};
constexpr std::size_t kModelStateKinds = 3;  // the first three

std::size_t kind_of(std::string_view label) {
  const std::string_view prefix = label.substr(0, label.find(':'));
  for (std::size_t k = 0; k + 1 < kKinds.size(); ++k)
    for (std::string_view p : kKinds[k].prefixes)
      if (!p.empty() && p == prefix) return k;
  return kKinds.size() - 1;
}

std::string gib_number(std::size_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / static_cast<double>(GiB)); }

// Live requested bytes by kind, per device, keeping each device's kinds at its peak.
struct DeviceTally {
  std::array<std::size_t, kKinds.size()> live{};
  std::array<std::size_t, kKinds.size()> at_peak{};
  std::size_t total = 0;
  std::size_t peak = 0;
};

// "a", "a and b", "a, b and c".
std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " and " : ", ";
    out += items[i];
  }
  return out;
}

const PlanFit* fit_of(const std::vector<PlanFit>& fits, std::string_view allocator) {
  for (const PlanFit& f : fits)
    if (f.allocator == allocator) return &f;
  return nullptr;
}

// The breakdown at `micro_batch`: from the trace the search kept of it (the micro-batch after an
// allocator's answer), else the report's family's (generated again, or the capture kept).
PeakBreakdown breakdown_at(const PlanReport& r, std::uint64_t micro_batch) {
  for (const PlanFit& f : r.fits)
    if (f.next_micro_batch == micro_batch && f.next_trace) return breakdown_at_peak(*f.next_trace);
  return breakdown_at_peak(*r.traces(micro_batch));
}

// Why micro-batch `mb` cannot fit, from its breakdown: the model states alone, or the whole peak.
std::string why_not(const PeakBreakdown& b, const PlanOptions& o, std::uint64_t mb) {
  const workload::WorkloadSetup& s = o.setup;
  const std::size_t capacity = o.capacity;
  const std::size_t states = b.model_states();
  const double share = 100.0 * static_cast<double>(states) / static_cast<double>(capacity);
  std::string per_param;
  if (o.capture.empty() && s.tp == 1 && s.pp == 1 && s.zero == 0 && s.model.parameters() > 0)
    per_param = fmt::format(": {:.1f} bytes per parameter for {:.2f}B parameters",
                            static_cast<double>(states) / static_cast<double>(s.model.parameters()),
                            static_cast<double>(s.model.parameters()) / 1e9);
  std::string out = fmt::format("The model states alone (weights, gradients and optimizer states{}) take {}, {:.0f}% of the card",
                                per_param, gib(states), share);
  out += states >= capacity ? ": more than it holds.\n"
         : share >= 80.0    ? ", before any activation.\n"
                            : ".\n";
  out += fmt::format("At micro-batch {} the live tensors peak at {}: {}.\n", mb, gib(b.peak), breakdown_text(b));
  return out;
}

std::string helping_changes(const PlanReport& r) {
  std::string out;
  for (const PlanChange& c : r.changes) {
    if (!c.helps) continue;
    std::uint64_t best = 0;
    std::vector<std::string> who;
    for (const PlanFit& f : c.fits) {
      if (!f.micro_batch) continue;
      if (*f.micro_batch > best) {
        best = *f.micro_batch;
        who.clear();
      }
      if (*f.micro_batch == best) who.push_back(f.allocator);
    }
    if (best == 0) continue;
    out += fmt::format("  - {} ({}): micro-batch {} with {}; costs: {}\n", c.change.description, c.change.options, best,
                       join(who), c.change.cost);
  }
  return out;
}

}  // namespace

std::size_t PeakBreakdown::model_states() const {
  std::size_t n = 0;
  for (std::size_t k = 0; k < kModelStateKinds && k < parts.size(); ++k) n += parts[k].bytes;
  return n;
}

PeakBreakdown breakdown_at_peak(const trace::Trace& trace) {
  std::map<int, DeviceTally> devices;
  struct Live {
    std::size_t bytes;
    std::size_t kind;
    int device;
  };
  std::unordered_map<std::uint64_t, Live> live;
  for (const trace::TraceEvent& e : trace.events) {
    const int device = e.device;
    if (e.op == trace::Op::alloc || e.op == trace::Op::seed_alloc) {
      const std::size_t kind = kind_of(e.label < trace.labels.size() ? trace.labels[e.label] : std::string_view{});
      live[e.addr] = Live{e.size, kind, device};
      DeviceTally& d = devices[device];
      d.live[kind] += e.size;
      d.total += e.size;
      if (d.total > d.peak) {
        d.peak = d.total;
        d.at_peak = d.live;
      }
    } else if (e.op == trace::Op::free_requested) {
      const auto it = live.find(e.addr);
      if (it == live.end()) continue;
      DeviceTally& d = devices[it->second.device];
      d.live[it->second.kind] -= it->second.bytes;
      d.total -= it->second.bytes;
      live.erase(it);
    }
  }
  PeakBreakdown out;
  for (const auto& [device, d] : devices) {
    if (!out.parts.empty() && d.peak <= out.peak) continue;
    out.device = device;
    out.peak = d.peak;
    out.parts.clear();
    for (std::size_t k = 0; k < kKinds.size(); ++k) out.parts.push_back({std::string(kKinds[k].name), d.at_peak[k]});
  }
  return out;
}

std::string breakdown_text(const PeakBreakdown& b) {
  std::vector<std::string> states;
  std::vector<std::string> rest;
  for (std::size_t k = 0; k < b.parts.size(); ++k) {
    if (b.parts[k].bytes == 0) continue;
    (k < kModelStateKinds ? states : rest).push_back(fmt::format("{} {}", b.parts[k].kind, gib_number(b.parts[k].bytes)));
  }
  std::vector<std::string> all;
  if (!states.empty()) {
    std::string s = fmt::format("model states {} (", gib(b.model_states()));
    for (std::size_t i = 0; i < states.size(); ++i) {
      if (i > 0) s += ", ";
      s += states[i];
    }
    all.push_back(s + ")");
  }
  for (const std::string& r : rest) all.push_back(r + " GiB");
  std::string out;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += ", ";
    out += all[i];
  }
  return out;
}

nlohmann::json breakdown_json(const PeakBreakdown& b) {
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& p : b.parts) parts[p.kind] = p.bytes;
  return {{"device", b.device}, {"peak_requested_bytes", b.peak}, {"model_states_bytes", b.model_states()}, {"bytes", parts}};
}

namespace {

// " over 8 data-parallel GPUs", or nothing with one.
std::string over_dp(const workload::WorkloadSetup& s) {
  return s.dp > 1 ? fmt::format(" over {} data-parallel GPUs", s.dp) : "";
}

void answer_nothing_fits(const PlanReport& r, PlanAnswer& a) {
  const workload::WorkloadSetup& s = r.options.setup;
  const std::size_t capacity = r.options.capacity;
  a.next_micro_batch = r.candidates.front();
  a.at_next = breakdown_at(r, *a.next_micro_batch);
  a.text = fmt::format("Answer: nothing fits on {}, not even micro-batch {}{}.\n", gib(capacity), *a.next_micro_batch,
                       over_dp(s));
  a.text += why_not(*a.at_next, r.options, *a.next_micro_batch);
  if (!r.options.capture.empty()) {
    a.text += "plan --capture tries no setup changes: change the script (activation checkpointing, a smaller "
              "sequence, an 8-bit optimizer) and plan it again.\n";
    return;
  }
  const std::string helping = helping_changes(r);
  a.text += helping.empty() ? "No single change tried (mixed precision, attention, checkpointing, an 8-bit optimizer, "
                              "offloading, LoRA, ZeRO, sequence length) makes it fit: the model states must shrink or be "
                              "spread over more GPUs (--dp N --zero 3).\n"
                            : "What fits instead:\n" + helping;
}

void answer_fits(const PlanReport& r, const std::vector<std::string>& best_allocators, PlanAnswer& a) {
  const workload::WorkloadSetup& s = r.options.setup;
  const std::uint64_t mb = *a.micro_batch;
  const std::uint64_t per_rank = s.effective_global_batch() / static_cast<std::uint64_t>(s.dp);
  a.at_answer = breakdown_at(r, mb);
  a.text = fmt::format("Answer: micro-batch {} x {} accumulation steps (global batch {}{}) fits {} with {}.\n", mb,
                       per_rank / mb, s.effective_global_batch(), over_dp(s), gib(r.options.capacity), join(best_allocators));
  if (const PlanFit* pytorch = fit_of(r.fits, "pytorch"); pytorch != nullptr && pytorch->micro_batch != a.micro_batch) {
    a.text += pytorch->micro_batch
                  ? fmt::format("PyTorch's own allocator (the pytorch model) fits micro-batch {} x {}.\n",
                                *pytorch->micro_batch, pytorch->accumulation)
                  : "PyTorch's own allocator (the pytorch model) fits no micro-batch at all.\n";
  }
  std::size_t least_waste = SIZE_MAX, most_waste = 0;
  for (const PlanFit& f : r.fits) {
    if (f.micro_batch != a.micro_batch) continue;
    const std::size_t waste = f.peak_reserved > f.peak_requested ? f.peak_reserved - f.peak_requested : 0;
    least_waste = std::min(least_waste, waste);
    most_waste = std::max(most_waste, waste);
  }
  a.text += fmt::format("At micro-batch {} the live tensors peak at {}: {}; the allocators that fit it reserve {} to {} more "
                        "(fragmentation and cache).\n",
                        mb, gib(a.at_answer->peak), breakdown_text(*a.at_answer), gib(least_waste), gib(most_waste));
  const auto next = std::upper_bound(r.candidates.begin(), r.candidates.end(), mb);
  if (next != r.candidates.end()) {
    a.next_micro_batch = *next;
    a.at_next = breakdown_at(r, *next);
    a.text += fmt::format("Micro-batch {} does not fit: its live tensors alone peak at {} ({}).\n", *next,
                          gib(a.at_next->peak), breakdown_text(*a.at_next));
  }
}

}  // namespace

PlanAnswer plan_answer(const PlanReport& r) {
  PlanAnswer a;
  std::vector<std::string> best_allocators;  // those that fit the largest micro-batch
  for (const PlanFit& f : r.fits) {
    if (!f.micro_batch) continue;
    if (!a.micro_batch || *f.micro_batch > *a.micro_batch) {
      a.micro_batch = f.micro_batch;
      best_allocators.clear();
    }
    if (*f.micro_batch == *a.micro_batch) best_allocators.push_back(f.allocator);
  }
  if (a.micro_batch) {
    answer_fits(r, best_allocators, a);
  } else {
    answer_nothing_fits(r, a);
  }
  return a;
}

nlohmann::json answer_json(const PlanAnswer& a) {
  const auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"text", a.text},
          {"micro_batch", opt(a.micro_batch)},
          {"breakdown", a.at_answer ? breakdown_json(*a.at_answer) : nlohmann::json(nullptr)},
          {"next_micro_batch", opt(a.next_micro_batch)},
          {"next_breakdown", a.at_next ? breakdown_json(*a.at_next) : nlohmann::json(nullptr)}};
}

}  // namespace tensorpool::cli
