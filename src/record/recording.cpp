// recording.cpp: the public face of live recording (tensorpool/record.hpp): the Recording
// handle, start_recording(), and the TENSORPOOL_TRACE hook with its process-wide recording.
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <set>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "core/logging.hpp"
#include "record/recorder.hpp"
#include "tensorpool/errors.hpp"

namespace tensorpool {

namespace {

/// `path` with every "%p" replaced by the process id.
std::string expand_path(const std::string& path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && path[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out += path[i];
    }
  }
  return out;
}

std::shared_ptr<detail::Recorder> make_recorder(Allocator& alloc, const std::string& path,
                                                RecordingOptions options, bool detach_on_stop) {
  auto recorder = std::make_shared<detail::Recorder>(expand_path(path), std::move(options), alloc);
  recorder->attach(alloc, -1, detach_on_stop);
  return recorder;
}

/// The TENSORPOOL_TRACE recording. Never destroyed (it may be used while the process exits);
/// stop_recording_from_env() completes the file, from atexit.
struct EnvRecording {
  std::mutex mutex;
  std::shared_ptr<detail::Recorder> recorder;
  bool gave_up = false;  // the file could not be created (logged once), or stopped
  std::set<int> devices;  // the trace devices given out so far
  int next_duplicate = kFirstDuplicateTraceDevice;

  /// The trace device of `alloc`: its ordinal, unless an allocator attached before has it.
  int trace_device(const Allocator& alloc) {
    int d = alloc.device().properties().ordinal;
    if (devices.count(d) != 0) {
      d = next_duplicate++;
      detail::log().info("tensorpool: TENSORPOOL_TRACE: another allocator of device {} is recorded "
                         "as trace device {}", alloc.device().properties().ordinal, d);
    }
    devices.insert(d);
    return d;
  }
};

EnvRecording& env_recording() {
  static EnvRecording* const env = new EnvRecording;
  return *env;
}

}  // namespace

Recording::Recording(std::shared_ptr<detail::Recorder> recorder) : recorder_(std::move(recorder)) {}
Recording::Recording(Recording&&) noexcept = default;
Recording& Recording::operator=(Recording&& other) noexcept {
  if (this != &other) {
    stop();
    recorder_ = std::move(other.recorder_);
  }
  return *this;
}
Recording::~Recording() { stop(); }

void Recording::attach(Allocator& alloc, int device) {
  if (!recorder_) throw UsageError("tensorpool: Recording::attach() on an empty Recording");
  recorder_->attach(alloc, device, true);
}

bool Recording::flush() { return recorder_ && recorder_->flush(); }
bool Recording::stop() { return recorder_ && recorder_->stop(); }
RecordingStatus Recording::status() const { return recorder_ ? recorder_->status() : RecordingStatus{}; }

Recording start_recording(Allocator& alloc, const std::string& path, RecordingOptions options) {
  return Recording(make_recorder(alloc, path, std::move(options), true));
}

bool attach_recording_from_env(Allocator& alloc) {
  const char* path = std::getenv("TENSORPOOL_TRACE");
  if (path == nullptr || *path == '\0') return false;
  EnvRecording& env = env_recording();
  std::lock_guard<std::mutex> lock(env.mutex);
  if (env.gave_up) return false;
  try {
    // Allocators may be destroyed at any time: the recording never removes its observers.
    if (!env.recorder) {
      env.recorder = std::make_shared<detail::Recorder>(expand_path(path), RecordingOptions{}, alloc);
      std::atexit(stop_recording_from_env);
    }
    const int device = env.trace_device(alloc);
    env.recorder->attach(alloc, device, false);
    return true;
  } catch (const std::exception& e) {
    env.gave_up = true;  // one error, then the process runs on unrecorded
    try {
      detail::log().error("tensorpool: TENSORPOOL_TRACE={}: not recording: {}", path, e.what());
    } catch (...) {
    }
    return false;
  }
}

void stop_recording_from_env() noexcept {
  EnvRecording& env = env_recording();
  std::shared_ptr<detail::Recorder> recorder;
  {
    std::lock_guard<std::mutex> lock(env.mutex);
    recorder = std::move(env.recorder);
    env.gave_up = env.gave_up || recorder != nullptr;
  }
  if (recorder) recorder->stop();
}

}  // namespace tensorpool
