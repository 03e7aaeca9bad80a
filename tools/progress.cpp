// progress.cpp: the progress bar on stderr (progress.hpp).
#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace tensorpool::cli {

namespace {

constexpr int kBarWidth = 28;
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

std::string duration_text(double seconds) {
  if (seconds < 60) return fmt::format("{:.0f}s", seconds);
  const auto s = static_cast<long>(seconds);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
}

}  // namespace

bool Progress::wanted(bool quiet, bool json) { return !quiet && !json && isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled, std::uint64_t total)
    : enabled_(enabled), total_(std::max<std::uint64_t>(total, 1)),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::step(const std::string& name) {
  if (!enabled_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  step_ = name;
  draw(true);
}

void Progress::add(std::uint64_t units) {
  if (!enabled_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  done_ = std::min(done_ + units, total_);
  draw(false);
}

void Progress::finish() {
  if (!enabled_) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  done_ = total_;
  step_ = "done";
  draw(true);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

std::function<void(std::uint64_t)> Progress::replay_counter() {
  if (!enabled_) return {};
  return [this, last = std::uint64_t{0}](std::uint64_t read) mutable {
    add(read - last);
    last = read;
  };
}

// One line, redrawn in place: "\r<step> [=====>    ]  42%  ETA 3s" and an erase to the line's end.
void Progress::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < kRedrawEvery) return;
  last_draw_ = now;
  const double fraction = static_cast<double>(done_) / static_cast<double>(total_);
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < kBarWidth) bar += '>' + std::string(static_cast<std::size_t>(kBarWidth - filled - 1), ' ');
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::string tail;
  if (finished_) {
    tail = "in " + duration_text(elapsed);
  } else if (fraction >= 0.01 && elapsed >= 0.5) {
    tail = "ETA " + duration_text(elapsed * (1.0 - fraction) / fraction);
  } else {
    tail = "ETA --";
  }
  fmt::print(stderr, "\r{} [{}] {:3.0f}%  {}\x1b[K", step_, bar, fraction * 100.0, tail);
  std::fflush(stderr);
}

}  // namespace tensorpool::cli
