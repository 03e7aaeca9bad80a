// recorder.cpp: the Recorder (record/recorder.hpp): taps on allocators, the writer thread that
// drains them into the sink, flush, stop, and the single report of a failure.
#include "record/recorder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/logging.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool::detail {

namespace {

std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// The OS thread id (what RMM's log prints), read once per thread.
std::uint64_t current_thread_id() noexcept {
#if defined(__linux__)
  static thread_local const auto id = static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
  static thread_local const auto id = std::hash<std::thread::id>{}(std::this_thread::get_id());
#endif
  return id;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::uint16_t device_of(const Allocator& alloc, int device) {
  const int d = device >= 0 ? device : alloc.device().properties().ordinal;
  if (d < 0 || d > 65535) throw UsageError(fmt::format("tensorpool recording: device {} is not in 0..65535", d));
  return static_cast<std::uint16_t>(d);
}

/// Config::to_string() without the `backend` key (the registry's choice of device backend, which
/// a replay refuses): the settings a replay takes (`--conf`).
std::string replay_settings(const Config& config) {
  std::string out;
  const std::string all = config.to_string();  // "key:value,..."; no value holds a comma
  std::string_view rest = all;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.starts_with("backend:")) continue;
    if (!out.empty()) out += ',';
    out += item;
  }
  return out;
}

trace::TraceInfo header(const Allocator& first) {
  const DeviceProperties& p = first.device().properties();
  return trace::TraceInfo{
      "tensorpool-recording",
      {fmt::format("pid={}", ::getpid()), fmt::format("started={}", utc_now()),
       fmt::format("device={}:{}", p.ordinal, p.name), fmt::format("capacity={}", p.capacity),
       fmt::format("config={}", replay_settings(first.config()))}};
}

trace::TraceEvent seed(trace::Op op, std::uint16_t device, Stream stream, Address addr,
                       std::size_t size, std::uint8_t flags = 0) {
  return {.op = op, .flags = flags, .device = device, .stream = stream, .addr = addr, .size = size};
}

/// The allocator's live state as seed events: its segments, then its allocated blocks.
std::vector<trace::TraceEvent> seed_events(const Allocator& alloc, std::uint16_t device) {
  const Snapshot snap = alloc.snapshot();
  std::vector<trace::TraceEvent> seeds;
  for (const SegmentInfo& seg : snap.segments) {
    const auto flags = static_cast<std::uint8_t>((seg.pool == Pool::small ? trace::kFlagSmallPool : 0) |
                                                 (seg.heap ? trace::kFlagExpandable : 0));
    seeds.push_back(seed(trace::Op::seed_segment, device, seg.stream, seg.address, seg.size, flags));
  }
  for (const SegmentInfo& seg : snap.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.state == BlockState::allocated)
        seeds.push_back(seed(trace::Op::seed_alloc, device, seg.stream, b.address, b.requested));
    }
  }
  return seeds;
}

}  // namespace

void RecorderSignal::notify_writer() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    pending = true;
  }
  wake_writer.notify_one();
}

// --- Tap: the observer on one allocator ------------------------------------------------------

class Recorder::Tap final : public Observer {
 public:
  Tap(std::shared_ptr<RecorderSignal> signal, std::size_t capacity, std::uint16_t device)
      : signal_(std::move(signal)), ring_(capacity), device_(device) {}

  // Called under the allocator's lock: a copy into the ring, and a wake-up every half ring.
  void on_event(const AllocatorEvent& e) noexcept override {
    if (!open_.load(std::memory_order_relaxed)) [[unlikely]] {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const ObservedEvent observed{e, current_thread_id()};
    if (ring_.try_push(observed)) [[likely]] {
      if ((ring_.pushed() & (ring_.capacity() / 2 - 1)) == 0) signal_->notify_writer();
      return;
    }
    push_when_room(observed);
  }

  /// Stops taking events (those still in the ring are written).
  void close() noexcept { open_.store(false, std::memory_order_release); }

  EventRing& ring() noexcept { return ring_; }
  std::uint16_t device() const noexcept { return device_; }
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  Allocator* allocator = nullptr;  // set when stop() must remove the observer
  HookId hook = 0;

 private:
  // The writer is a whole ring behind: wait for it (the trace must not have holes), unless the
  // recording stops meanwhile.
  void push_when_room(const ObservedEvent& observed) noexcept {
    while (open_.load(std::memory_order_acquire)) {
      signal_->notify_writer();
      if (ring_.try_push(observed)) return;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }

  const std::shared_ptr<RecorderSignal> signal_;
  EventRing ring_;
  const std::uint16_t device_;
  std::atomic<bool> open_{true};
  std::atomic<std::uint64_t> dropped_{0};
};

// --- Recorder --------------------------------------------------------------------------------

Recorder::Recorder(const std::string& path, RecordingOptions options, const Allocator& first)
    : options_(std::move(options)),
      path_(path),
      started_ns_(steady_now_ns()),
      signal_(std::make_shared<RecorderSignal>()) {
  if (options_.flush_interval.count() <= 0) {
    throw ConfigError(fmt::format("tensorpool recording: flush_interval must be positive, got {} ms",
                                  options_.flush_interval.count()));
  }
  sink_ = open_sink(path_, options_.format, header(first));
  sink_->checkpoint();  // the header is in the file from the start
  temp_path_ = sink_->temp_path();
  batch_.resize(std::bit_ceil(std::max<std::size_t>(options_.buffer_events, 64)));
  writer_ = std::thread([this] { run(); });
}

Recorder::~Recorder() { stop(); }

void Recorder::attach(Allocator& alloc, int device, bool detach_on_stop) {
  const std::uint16_t d = device_of(alloc, device);
  auto tap = std::make_shared<Tap>(signal_, options_.buffer_events, d);
  std::vector<trace::TraceEvent> seeds = seed_events(alloc, d);
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (stopping_ || stopped_) throw UsageError("tensorpool recording: attach() after stop()");
    if (failed_.load()) return;  // reported already; nothing more is recorded
    pending_seeds_.insert(pending_seeds_.end(), seeds.begin(), seeds.end());
    taps_.push_back(tap);
  }
  const HookId id = alloc.add_observer(tap);
  if (detach_on_stop) {
    tap->allocator = &alloc;
    tap->hook = id;
  }
}

bool Recorder::flush() {
  std::unique_lock<std::mutex> lock(signal_->mutex);
  if (writer_done_ || stopping_) return false;
  const std::uint64_t ticket = ++flush_requested_;
  signal_->pending = true;
  signal_->wake_writer.notify_one();
  signal_->batch_done.wait(lock, [&] { return flush_done_ >= ticket || writer_done_; });
  return !failed_.load();
}

bool Recorder::stop() {
  std::vector<std::shared_ptr<Tap>> taps;
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    if (stopped_) return !failed_.load();
    stopped_ = true;
    taps = taps_;
  }
  // Detach first, so that the last batch holds everything observed before stop().
  for (const auto& tap : taps) {
    tap->close();
    if (tap->allocator != nullptr) tap->allocator->remove_hook(tap->hook);
  }
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    stopping_ = true;
  }
  signal_->notify_writer();
  if (writer_.joinable()) writer_.join();
  return !failed_.load();
}

RecordingStatus Recorder::status() const {
  RecordingStatus s;
  std::lock_guard<std::mutex> lock(signal_->mutex);
  s.failed = failed_.load();
  s.active = !stopped_ && !s.failed;
  s.error = error_;
  for (const auto& tap : taps_) {
    s.events_recorded += tap->ring().pushed();
    s.events_dropped += tap->dropped();
  }
  s.events_written = events_written_.load();
  s.path = path_;
  s.temp_path = writer_done_ || s.failed ? "" : temp_path_;
  return s;
}

// --- the writer thread -----------------------------------------------------------------------

void Recorder::run() noexcept {
  for (;;) {
    std::vector<trace::TraceEvent> seeds;
    std::vector<std::shared_ptr<Tap>> taps;
    std::uint64_t ticket = 0;
    bool final = false;
    {
      std::unique_lock<std::mutex> lock(signal_->mutex);
      signal_->wake_writer.wait_for(lock, options_.flush_interval, [&] { return signal_->pending; });
      signal_->pending = false;
      seeds.swap(pending_seeds_);
      taps = taps_;
      ticket = flush_requested_;
      final = stopping_;
    }
    const bool ok = write_batch(seeds, taps, final);
    {
      std::lock_guard<std::mutex> lock(signal_->mutex);
      flush_done_ = ticket;
      writer_done_ = final || !ok;
    }
    signal_->batch_done.notify_all();
    if (final || !ok) return;
  }
}

bool Recorder::write_batch(const std::vector<trace::TraceEvent>& seeds,
                           const std::vector<std::shared_ptr<Tap>>& taps, bool final) noexcept {
  if (failed_.load()) return false;
  try {
    std::uint64_t written = 0;
    for (const trace::TraceEvent& e : seeds) sink_->write(e, 0);
    for (const auto& tap : taps) {
      // At most a ring's worth: everything present when the batch began, however busy the tap.
      const std::size_t n = tap->ring().pop(batch_.data(), batch_.size());
      for (std::size_t i = 0; i < n; ++i) {
        const std::optional<trace::TraceEvent> e = to_trace_event(batch_[i].event, tap->device(), started_ns_);
        if (!e) continue;
        sink_->write(*e, batch_[i].thread);
        ++written;
      }
    }
    if (final) {
      sink_->finish();
      sink_.reset();
    } else if (written != 0 || !seeds.empty()) {
      sink_->checkpoint();
    }
    events_written_.fetch_add(written);
    return true;
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("unknown error");
  }
  return false;
}

void Recorder::fail(const std::string& message) noexcept {
  std::vector<std::shared_ptr<Tap>> taps;
  {
    std::lock_guard<std::mutex> lock(signal_->mutex);
    failed_.store(true);
    error_ = message;
    taps = taps_;
  }
  for (const auto& tap : taps) tap->close();  // the allocators go on, unrecorded
  sink_.reset();                              // removes the partial file
  const std::string text =
      fmt::format("tensorpool: recording to '{}' stopped: {}; the allocator goes on unrecorded",
                  path_, message);
  try {
    if (options_.on_error) {
      options_.on_error(text);
    } else {
      log().error("{}", text);
    }
  } catch (...) {
    // A failing error handler must not take the writer thread (and the process) down.
  }
}

}  // namespace tensorpool::detail
