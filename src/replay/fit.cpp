// fit.cpp: the capacity search (fit) and the search over a trace family (largest_fitting): see
// fit.hpp for what they assume and how the answer is checked.
#include "tensorpool/replay/fit.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "tensorpool/errors.hpp"

namespace tensorpool::replay {

void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t)>& task) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min<std::size_t>(threads, n);
  std::atomic<std::size_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        task(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (std::size_t w = 0; w < workers; ++w) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (first_error) std::rethrow_exception(first_error);
}

std::vector<FitTarget> fit_targets(const std::vector<std::string>& allocators,
                                   const std::vector<std::string>& confs) {
  std::vector<FitTarget> out;
  for (std::size_t i = 0; i < allocators.size(); ++i)
    out.push_back({allocators[i], i < confs.size() ? confs[i] : std::string()});
  return out;
}

ReplayReport replay_at(const trace::Trace& trace, const FitTarget& target, std::size_t capacity,
                       int device, int warmup, OnOom on_oom) {
  TraceSource source(trace);
  ReplayOptions o;
  o.allocator = target.allocator;
  o.target.capacity = capacity;
  o.target.conf = target.conf;
  o.target.cost_model = target.cost_model;
  o.target.device_lag = target.device_lag;
  o.step_at_iterations = target.step_at_iterations;
  o.device = device;
  o.warmup = warmup;
  o.on_oom = on_oom;
  return replay(source, o);
}

// --- fit ------------------------------------------------------------------------------------

namespace {

constexpr std::size_t round_down(std::size_t v, std::size_t m) { return v / m * m; }

// The bisection over capacities for one target on one device.
class CapacitySearch {
 public:
  CapacitySearch(const std::function<ReplayResult(std::size_t)>& replay_at_capacity, std::size_t peak,
                 const FitOptions& o)
      : replay_(replay_at_capacity), options_(o) {
    fit_.peak_requested = peak;
    // Below the requested peak the live blocks cannot all be held: a known failure, not replayed.
    lo_ = peak > 0 ? peak - 1 : 0;
  }

  DeviceFit run() {
    if (!find_upper_bound()) return fit_;
    fit_.fits = true;
    constexpr int kRestarts = 4;
    for (int attempt = 0; attempt <= kRestarts && !fit_.verified; ++attempt) {
      bisect();
      verify();
    }
    if (largest_failure_ > fit_.capacity) fit_.oom_above = largest_failure_;
    fit_.ratio = fit_.peak_requested == 0 ? 1.0
                                          : static_cast<double>(fit_.capacity) /
                                                static_cast<double>(fit_.peak_requested);
    return fit_;
  }

 private:
  ReplayResult probe(std::size_t capacity) {
    ++fit_.replays;
    return replay_(capacity);
  }

  void fitted(std::size_t capacity, ReplayResult r) {
    fit_.capacity = capacity;
    fit_.at_capacity = std::move(r);
  }
  void failed(std::size_t capacity, ReplayResult r) {
    largest_failure_ = std::max(largest_failure_, capacity);
    if (fit_.below && fit_.below_capacity > capacity) return;  // keep the one just below
    fit_.below_capacity = capacity;
    fit_.below = std::move(r);
  }

  // From 1.25x the peak, doubling until a replay has no OOM. False when none is found.
  bool find_upper_bound() {
    const std::size_t peak = fit_.peak_requested;
    const auto limit = static_cast<std::size_t>(static_cast<double>(std::max(peak, MiB)) * options_.max_ratio);
    std::size_t hi = std::max<std::size_t>((peak + peak / 4 + MiB - 1) / MiB * MiB, 2 * MiB);
    for (;;) {
      ReplayResult r = probe(hi);
      if (r.ooms == 0) {
        fitted(hi, std::move(r));
        return true;
      }
      failed(hi, std::move(r));
      lo_ = hi;
      if (hi >= limit) return false;
      hi = std::min(hi * 2, limit);
    }
  }

  // At least one byte: the bisection ends even with both tolerances 0.
  std::size_t tolerance(std::size_t hi) const {
    return std::max({static_cast<std::size_t>(static_cast<double>(hi) * options_.relative_tolerance),
                     options_.absolute_tolerance, std::size_t{1}});
  }

  // Invariant: a replay at capacity_ has no OOM; one at lo_ has one (or lo_ is below the peak).
  void bisect() {
    while (fit_.capacity - lo_ > tolerance(fit_.capacity)) {
      std::size_t mid = lo_ + (fit_.capacity - lo_) / 2;
      if (round_down(mid, MiB) > lo_) mid = round_down(mid, MiB);  // whole MiB where possible
      ReplayResult r = probe(mid);
      if (r.ooms == 0) {
        fitted(mid, std::move(r));
      } else {
        failed(mid, std::move(r));
        lo_ = mid;
      }
    }
  }

  // The answer must OOM 1% below; if it does not, the bisection was misled by a capacity that
  // OOMed above one that does not: search again below.
  void verify() {
    const std::size_t check = fit_.capacity - fit_.capacity / 100;
    if (fit_.below && fit_.below_capacity == check) {
      fit_.verified = true;
      return;
    }
    ReplayResult r = probe(check);
    if (r.ooms > 0) {
      failed(check, std::move(r));
      fit_.verified = true;
      return;
    }
    fit_.monotone = false;
    fitted(check, std::move(r));
    fit_.below.reset();
    lo_ = fit_.peak_requested > 0 ? fit_.peak_requested - 1 : 0;
  }

  const std::function<ReplayResult(std::size_t)>& replay_;
  const FitOptions& options_;
  DeviceFit fit_;
  std::size_t lo_ = 0;
  std::size_t largest_failure_ = 0;  // the largest capacity replayed with an OOM
};

// The devices the search covers, with the peak requested of each (the floor of its search).
std::map<int, std::size_t> device_floors(const trace::Trace& t, int only) {
  TraceSource source(t);
  const BaselineReport b = baseline(source, "requested", only);
  std::map<int, std::size_t> floors;
  for (const auto& d : b.devices) floors[d.result.device] = d.result.peak_requested;
  if (only >= 0 && floors.empty())
    throw UsageError("device " + std::to_string(only) + " has no events in the trace");
  return floors;
}

// The result of a capacity the target's settings do not fit: not fitting, with no OOM to explain.
ReplayResult refused_result(const std::string& allocator, int device) {
  ReplayResult r;
  r.allocator = allocator;
  r.device = device;
  r.ooms = 1;
  return r;
}

}  // namespace

DeviceFit search_capacity(const std::function<ReplayResult(std::size_t capacity)>& replay_at_capacity,
                          std::size_t floor, const FitOptions& options) {
  return CapacitySearch(replay_at_capacity, floor, options).run();
}

std::vector<FitResult> fit(const trace::Trace& trace, const FitOptions& options) {
  // A conf no device fits is an error here; what is left to refuse depends on the capacity.
  for (const FitTarget& t : options.targets) validate_target(t.allocator, t.conf);
  const std::map<int, std::size_t> floors = device_floors(trace, options.device);
  std::vector<std::pair<int, std::size_t>> devices(floors.begin(), floors.end());
  std::vector<FitResult> results(options.targets.size());
  for (std::size_t i = 0; i < results.size(); ++i) {
    results[i].allocator = options.targets[i].allocator;
    results[i].devices.resize(devices.size());
  }
  const std::size_t per_target = devices.size();
  parallel_for(results.size() * per_target, options.threads, [&](std::size_t task) {
    const std::size_t t = task / per_target;
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    const int device = devices[task % per_target].first;
    const std::size_t floor = devices[task % per_target].second;
    const FitTarget& target = options.targets[t];
    std::map<std::size_t, std::string> refused;  // capacities the target could not be built on
    DeviceFit d = search_capacity(
        [&](std::size_t capacity) {
          ReplayResult r;
          try {
            r = replay_at(trace, target, capacity, device, options.warmup, OnOom::stop).total;
          } catch (const ConfigError& e) {
            refused[capacity] = e.what();
            r = refused_result(target.allocator, device);
          }
          if (options.on_replay) options.on_replay();
          return r;
        },
        floor, options);
    if (d.below && refused.count(d.below_capacity) != 0) d.below_refused = refused[d.below_capacity];
    d.allocator = target.allocator;
    d.device = device;
    results[t].devices[task % per_target] = std::move(d);
  });
  for (FitResult& r : results) {
    r.fits = !r.devices.empty();
    for (const DeviceFit& d : r.devices) {
      r.fits = r.fits && d.fits;
      r.capacity = std::max(r.capacity, d.capacity);
    }
  }
  return results;
}

// --- largest_fitting ------------------------------------------------------------------------

namespace {

// Each member of the family built once, by the first thread that needs it.
class FamilyCache {
 public:
  FamilyCache(const std::vector<std::uint64_t>& values, const TraceFamily& family)
      : values_(values), family_(family) {}

  std::shared_ptr<const trace::Trace> get(std::size_t index) {
    std::promise<std::shared_ptr<const trace::Trace>> promise;
    std::shared_future<std::shared_ptr<const trace::Trace>> future;
    bool build = false;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto it = members_.find(index);
      if (it == members_.end()) {
        future = promise.get_future().share();
        members_.emplace(index, future);
        build = true;
      } else {
        future = it->second;
      }
    }
    if (build) {
      try {
        promise.set_value(family_(values_[index]));
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    }
    return future.get();
  }

 private:
  const std::vector<std::uint64_t>& values_;
  const TraceFamily& family_;
  std::mutex mutex_;
  std::map<std::size_t, std::shared_future<std::shared_ptr<const trace::Trace>>> members_;
};

bool no_oom(const ReplayReport& r) { return r.total.ooms == 0; }

}  // namespace

std::vector<LargestFit> largest_fitting(const std::vector<std::uint64_t>& candidates,
                                        const TraceFamily& family,
                                        const std::vector<FitTarget>& targets,
                                        std::size_t capacity, unsigned threads,
                                        const std::function<void()>& on_replay) {
  FamilyCache cache(candidates, family);
  std::vector<LargestFit> results(targets.size());
  parallel_for(targets.size(), threads, [&](std::size_t t) {
    LargestFit& out = results[t];
    out.allocator = targets[t].allocator;
    // Invariant: candidates[lo] fits (lo = -1: none known to), candidates[hi] does not (hi = n:
    // past the end).
    std::ptrdiff_t lo = -1;
    auto hi = static_cast<std::ptrdiff_t>(candidates.size());
    while (hi - lo > 1) {
      const std::ptrdiff_t mid = lo + (hi - lo) / 2;
      std::shared_ptr<const trace::Trace> member = cache.get(static_cast<std::size_t>(mid));
      ReplayReport r = replay_at(*member, targets[t], capacity, /*device=*/-1, /*warmup=*/0, OnOom::stop);
      ++out.replays;
      if (on_replay) on_replay();
      if (no_oom(r)) {
        lo = mid;
        out.at_best = std::move(r);
      } else {
        hi = mid;
        out.at_next = std::move(r);
        out.next_trace = std::move(member);
      }
    }
    if (lo >= 0) out.index = static_cast<std::size_t>(lo);
  });
  return results;
}

}  // namespace tensorpool::replay
