// plan_capture.cpp: the captured traces of `tensorpool plan --capture` (plan_capture.hpp).
#include "plan_capture.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "tensorpool/errors.hpp"
#include "tensorpool/trace/format.hpp"

namespace tensorpool::cli {

namespace {

constexpr std::string_view kPlaceholder = "{micro_batch}";

// 'text' for a POSIX shell.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string substituted(std::string text, std::uint64_t mb) {
  for (std::size_t at = text.find(kPlaceholder); at != std::string::npos; at = text.find(kPlaceholder, at))
    text.replace(at, kPlaceholder.size(), std::to_string(mb));
  return text;
}

std::string last_lines(const std::string& path, std::size_t lines) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::size_t at = text.size();
  for (std::size_t n = 0; n <= lines && at != std::string::npos && at > 0; ++n) at = text.rfind('\n', at - 1);
  return at == std::string::npos ? text : text.substr(at + 1);
}

// A file name of our own under $TMPDIR (or /tmp) with the suffix; the caller removes it.
std::string temporary(const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/tensorpool-capture-XXXXXX{}", dir != nullptr && *dir != '\0' ? dir : "/tmp", suffix);
  const int fd = mkstemps(path.data(), static_cast<int>(suffix.size()));
  if (fd < 0) throw ConfigError(fmt::format("plan --capture: cannot make a temporary file {}", path));
  ::close(fd);
  return path;
}

std::shared_ptr<const trace::Trace> capture(const CaptureCommand& c, std::uint64_t mb) {
  const std::string out = temporary(".jsonl");
  const std::string log = temporary(".log");
  const std::string command = c.command_for(mb, out);
  const int status = std::system((command + " >" + quoted(log) + " 2>&1").c_str());
  const int code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::shared_ptr<const trace::Trace> trace;
  std::string error;
  if (code == 0) {
    try {
      trace = std::make_shared<const trace::Trace>(trace::read_trace(out));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string printed = last_lines(log, 12);
  std::remove(out.c_str());
  std::remove(log.c_str());
  if (code != 0)
    throw ConfigError(fmt::format("plan --capture: capturing micro-batch {} failed (exit status {}): {}\n{}", mb, code,
                                  command, printed));
  if (!trace) throw ConfigError(fmt::format("plan --capture: the capture of micro-batch {} is unreadable: {}", mb, error));
  return trace;
}

}  // namespace

std::string CaptureCommand::command_for(std::uint64_t mb, const std::string& out) const {
  return fmt::format("{} -m tensorpool.capture --out {} --steps {} {}", quoted(python), quoted(out), steps,
                     substituted(script, mb));
}

void check_capture(const CaptureCommand& c) {
  if (c.script.find(kPlaceholder) == std::string::npos)
    throw ConfigError(fmt::format("plan --capture '{}': the script's arguments must say where the micro-batch goes, "
                                  "as {{micro_batch}} (for example: train.py --batch-size {{micro_batch}})",
                                  c.script));
  if (c.steps == 0) throw ConfigError("plan --capture-steps: at least 1 optimizer step");
}

replay::TraceFamily capture_family(const CaptureCommand& c) {
  struct Cache {
    std::mutex mutex;
    std::map<std::uint64_t, std::shared_ptr<const trace::Trace>> traces;
  };
  auto cache = std::make_shared<Cache>();
  return [c, cache](std::uint64_t mb) {
    const std::lock_guard<std::mutex> lock(cache->mutex);  // one capture at a time
    auto& slot = cache->traces[mb];
    if (!slot) slot = capture(c, mb);
    return slot;
  };
}

}  // namespace tensorpool::cli
