// inference.cpp: the trace of serving a stream of requests with continuous batching (what it
// allocates and when: setup.hpp).
#include <algorithm>
#include <deque>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "builders.hpp"
#include "layout.hpp"
#include "trace_builder.hpp"

namespace tensorpool::workload {

namespace {

struct Request {
  double arrival = 0.0;     // in decode steps
  std::uint64_t prompt = 1;
  std::uint64_t output = 1;  // tokens to generate (the first comes from the prefill)
  std::uint64_t tokens = 0;  // in the KV cache
  std::uint64_t generated = 0;
  // contiguous: one tensor per layer; paged: the blocks; concat: layer l's key at 2l and value at
  // 2l + 1 (0 until the prefill's forward pass makes them)
  std::vector<std::uint64_t> kv;
};

class InferenceTrace {
 public:
  InferenceTrace(const WorkloadSetup& s, trace::Trace& t) : s_(s), b_(t), rng_(s.seed) {
    e_ = s.element_bytes();
    t_ = static_cast<std::uint64_t>(s.tp);
    h_ = s.model.hidden;
  }

  void run() {
    create_weights();
    draw_requests();
    std::uint64_t step = 0;
    while (!waiting_.empty() || !running_.empty()) {
      if (running_.empty() && waiting_.front().arrival > static_cast<double>(step))
        step = static_cast<std::uint64_t>(waiting_.front().arrival + 0.999999);  // idle until the next one
      b_.iteration(step);
      admit(step);
      if (!running_.empty()) decode();
      retire();
      ++step;
    }
  }

 private:
  void create_weights() {
    std::vector<Param> params = embedding_params(s_);
    for (int l = 0; l < s_.model.layers; ++l) {
      const std::vector<Param> layer = layer_params(s_);
      params.insert(params.end(), layer.begin(), layer.end());
    }
    const std::vector<Param> head = head_params(s_);
    params.insert(params.end(), head.begin(), head.end());
    for (const Param& p : params) b_.alloc(e_ * p.elements, "weights:" + p.name);
  }

  void draw_requests() {
    const LengthDistribution prompt = s_.prompt_lengths();
    const LengthDistribution output = s_.output_lengths();
    std::exponential_distribution<double> gap(s_.arrival_rate);
    double at = 0.0;
    for (std::uint64_t i = 0; i < s_.requests; ++i) {
      Request r;
      r.arrival = at;
      r.prompt = draw_length(prompt, rng_);
      r.output = draw_length(output, rng_);
      waiting_.push_back(r);
      if (s_.arrival == Arrival::poisson) at += gap(rng_);
      else if (s_.arrival == Arrival::fixed) at += 1.0 / s_.arrival_rate;
    }
  }

  // Requests that have arrived join the batch while there is room; each is prefilled.
  void admit(std::uint64_t step) {
    while (!waiting_.empty() && running_.size() < s_.max_batch &&
           waiting_.front().arrival <= static_cast<double>(step)) {
      running_.push_back(waiting_.front());
      waiting_.pop_front();
      prefill(running_.back());
    }
  }

  // --- the KV cache --------------------------------------------------------------------------

  std::uint64_t kv_layer_bytes_per_token() const {
    return 2 * s_.model.kv_dim() / t_ * e_;
  }

  void reserve_kv(Request& r) {
    if (s_.kv == KvLayout::contiguous) {  // one tensor per layer, for the whole request
      for (int l = 0; l < s_.model.layers; ++l)
        r.kv.push_back(b_.alloc(kv_layer_bytes_per_token() * (r.prompt + r.output), "kv_cache:layer"));
    } else if (s_.kv == KvLayout::concat) {
      r.kv.assign(2 * static_cast<std::size_t>(s_.model.layers), 0);
    }
    grow_kv(r, r.prompt);
  }

  // The cache holds `tokens` tokens of r from now on (paged: a block whenever one fills up;
  // concat: made by the next forward pass, update_kv()).
  void grow_kv(Request& r, std::uint64_t tokens) {
    if (s_.kv == KvLayout::paged) {
      const std::uint64_t blocks = (tokens + s_.kv_block - 1) / s_.kv_block;
      while (r.kv.size() < blocks) r.kv.push_back(b_.alloc(s_.kv_bytes_per_token() * s_.kv_block, "kv_cache:block"));
    }
    r.tokens = tokens;
  }

  // kv:concat, at layer l's attention: the key, then the value, replaced by a tensor of r.tokens
  // tokens (torch.cat of the old one and the new tokens'), the old one freed once the new exists.
  void update_kv(Request& r, int l) {
    const std::uint64_t bytes = kv_layer_bytes_per_token() / 2 * r.tokens;
    for (const std::size_t i : {2 * static_cast<std::size_t>(l), 2 * static_cast<std::size_t>(l) + 1}) {
      const std::uint64_t old = r.kv[i];
      r.kv[i] = b_.alloc(bytes, i % 2 == 0 ? "kv_cache:layer.key" : "kv_cache:layer.value");
      if (old != 0) b_.free(old);
    }
  }

  // --- forward passes ------------------------------------------------------------------------

  // The forward pass over `rows` tokens: the residual stream, per layer its temporaries (and, for
  // kv:concat, the caches of `growing` replaced at its attention).
  void forward(std::uint64_t rows, const char* phase, std::span<Request* const> growing) {
    const std::string tmp = std::string("temporaries:") + phase + ".";
    std::uint64_t x = b_.alloc(rows * h_ * e_, tmp + "embedding");
    const std::uint64_t experts_per_token = s_.model.experts > 1 ? static_cast<std::uint64_t>(s_.model.top_k) : 1;
    const std::uint64_t inner = rows * experts_per_token * s_.model.ffn / t_ * e_;
    for (int l = 0; l < s_.model.layers; ++l) {
      const std::uint64_t qkv = b_.alloc(rows * (h_ + 2 * s_.model.kv_dim()) / t_ * e_, tmp + "attention.qkv");
      if (s_.kv == KvLayout::concat)
        for (Request* r : growing) update_kv(*r, l);
      const std::uint64_t ctx = b_.alloc(rows * h_ / t_ * e_, tmp + "attention.context");
      b_.free(qkv);
      const std::uint64_t resid = b_.alloc(rows * h_ * e_, tmp + "attention.residual");
      b_.free(ctx);
      const std::uint64_t up = b_.alloc(inner * (s_.model.mlp == MlpKind::gated ? 2 : 1), tmp + "mlp.inner");
      const std::uint64_t out = b_.alloc(rows * h_ * e_, tmp + "layer_output");
      b_.free(up);
      b_.free(resid);
      b_.free(x);
      x = out;
    }
    const std::uint64_t logits = b_.alloc((phase[0] == 'p' ? 1 : rows) * s_.vocab_per_rank() * 4, tmp + "logits");
    b_.free(x);
    b_.free(logits);
  }

  void prefill(Request& r) {
    reserve_kv(r);
    Request* const growing[] = {&r};
    forward(r.prompt, "prefill", growing);
    r.generated = 1;
  }

  // One token for every running request: the cache grows by the token fed in.
  void decode() {
    std::vector<Request*> growing;
    for (Request& r : running_) {
      if (r.generated >= r.output) continue;
      grow_kv(r, r.tokens + 1);
      growing.push_back(&r);
    }
    if (growing.empty()) return;
    forward(growing.size(), "decode", growing);
    for (Request* r : growing) ++r->generated;
  }

  // Finished requests free their cache at once (the next step admits others into their room).
  void retire() {
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->generated < it->output) {
        ++it;
        continue;
      }
      for (std::uint64_t a : it->kv)
        if (a != 0) b_.free(a);
      it = running_.erase(it);
    }
  }

  const WorkloadSetup& s_;
  TraceBuilder b_;
  std::mt19937_64 rng_;
  std::uint64_t e_ = 2, t_ = 1, h_ = 0;
  std::deque<Request> waiting_;  // by arrival
  std::vector<Request> running_;
};

}  // namespace

trace::Trace generate_inference_trace(const WorkloadSetup& s) {
  trace::Trace t;
  InferenceTrace(s, t).run();
  return t;
}

}  // namespace tensorpool::workload
