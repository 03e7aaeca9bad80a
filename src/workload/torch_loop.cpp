// torch_loop.cpp: the trace of a plain PyTorch training loop (framework:pytorch) and of forward
// passes (mode:forward), op by op on the eager-mode emulation of autograd.hpp.
//
// The loop is the one people write:
//   for each micro-batch: [with torch.autocast(...):] logits = model(x); loss = loss_fn(logits, y)
//                         loss.backward()
//   [clip_grad_norm_] optimizer.step(); optimizer.zero_grad(set_to_none=True)
// `logits` and `loss` stay referenced by the loop's variables until the next micro-batch rebinds
// them (after its forward pass). The model is a pre-norm decoder: embedding (+ learned positions),
// layers of norm / attention / residual add / norm / MLP / residual add, a final norm and the
// output layer; every dtype follows CUDA autocast's op lists (docs/workloads.md, "The PyTorch
// loop").
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "autograd.hpp"
#include "builders.hpp"
#include "layout.hpp"
#include "trace_builder.hpp"

namespace tensorpool::workload {

namespace {

struct LayerWeights {
  Var norm1, norm1_bias, q, k, v, qkv, o, norm2, norm2_bias;
  Var gate, up, down;  // gated MLP (gate, up, down) or fc1 = up, fc2 = down
  Var q_bias, k_bias, v_bias, qkv_bias, o_bias, up_bias, down_bias;
};

struct Shape {  // one micro-batch
  std::uint64_t batch = 1, seq = 1;
  std::uint64_t tokens() const { return batch * seq; }
};

class TorchLoop {
 public:
  TorchLoop(const WorkloadSetup& s, TraceBuilder& b) : s_(s), b_(b), a_(b) {
    const ModelShape& m = s.model;
    h_ = m.hidden;
    kv_ = m.kv_dim();
    heads_ = static_cast<std::uint64_t>(m.heads);
    param_dtype_ = s.precision == Precision::fp32 || autocast() ? DType::f32 : low_dtype();
  }

  void train(const std::vector<std::vector<std::uint64_t>>& lengths) {
    create_model();
    for (std::size_t step = 0; step < lengths.size(); ++step) {
      b_.iteration(step);
      if (s_.empty_cache) b_.empty_cache();
      for (std::uint64_t len : lengths[step]) micro_batch(shape_of(len));
      optimizer_step(step == 0);
      a_.zero_grad();
    }
  }

  void forward_passes(const std::vector<std::vector<std::uint64_t>>& lengths) {
    create_model();
    a_.set_grad_enabled(!s_.no_grad);
    std::size_t previous_graph = 0;
    for (std::size_t step = 0; step < lengths.size(); ++step) {
      b_.iteration(step);
      if (s_.empty_cache) b_.empty_cache();
      for (std::uint64_t len : lengths[step]) {
        const Shape sh = shape_of(len);
        drop_inputs();
        ids_ = a_.constant(sh.tokens(), DType::i64, "inputs:input_ids");
        const std::size_t graph = a_.mark();
        if (autocast()) a_.enter_autocast();
        Var out = model_forward(sh);
        if (autocast()) a_.exit_autocast();
        a_.drop(logits_);  // the variable rebound: the previous output and its graph go
        a_.free_graph(previous_graph, graph);
        previous_graph = graph;
        logits_ = out;
      }
    }
  }

 private:
  // --- dtypes --------------------------------------------------------------------------------

  bool autocast() const { return s_.autocast(); }
  DType low_dtype() const {
    return s_.precision == Precision::fp16 || s_.precision == Precision::autocast_fp16 ? DType::f16 : DType::bf16;
  }
  // What a matmul-like op (linear, bmm, sdpa) computes in: 16 bits under autocast, else its inputs'.
  DType matmul_dtype(Var x) const { return autocast() ? low_dtype() : a_.dtype(x); }
  // The label of autocast's cast of an activation: "autocast.NAME", after the kind when the name
  // has one ("loss:exp" -> "loss:autocast.exp"), so that the cast counts with its kind.
  static std::string cast_label(const std::string& name) {
    const std::size_t colon = name.find(':');
    if (colon == std::string::npos) return "autocast." + name;
    return name.substr(0, colon + 1) + "autocast." + name.substr(colon + 1);
  }
  // An op's input as autocast hands it over: cast to `to` (16 bits for matmuls; fp32 for exp, log,
  // softmax, sum, layer_norm, cross_entropy) when autocast is on and it is not in `to` already (a
  // new tensor each time, which release_input() drops), else the input itself.
  Var autocast_input(Var x, DType to, const std::string& label) {
    return autocast() && a_.dtype(x) != to ? a_.cast(x, to, cast_label(label)) : x;
  }
  Var fp32_input(Var x, const std::string& label) { return autocast_input(x, DType::f32, label); }
  // Drops `in` when it is a cast made for an op rather than the tensor `of` itself.
  void release_input(Var in, Var of) {
    if (in.id != of.id) a_.drop(in);
  }

  Shape shape_of(std::uint64_t len) const {
    Shape sh{s_.micro_batch, len};
    if (s_.batching == Batching::dynamic) sh.batch = std::max<std::uint64_t>(1, s_.micro_batch * s_.sequence() / len);
    return sh;
  }

  // --- the model's parameters --------------------------------------------------------------

  Var param(std::uint64_t elements, const std::string& name) {
    params_.push_back(a_.parameter(elements, param_dtype_, name, true));
    return params_.back();
  }
  Var bias(std::uint64_t elements, const std::string& name) {
    return s_.model.biases ? param(elements, name + ".bias") : Var{};
  }
  Var norm_param(const std::string& name) { return param(h_, name); }
  Var norm_bias(const std::string& name) {
    return s_.model.norm == NormKind::layernorm ? param(h_, name + ".bias") : Var{};
  }

  void create_model() {
    const ModelShape& m = s_.model;
    embedding_ = param(m.vocab * h_, "embedding.tokens");
    if (m.positions > 0) positions_ = param(m.positions * h_, "embedding.positions");
    for (int l = 0; l < m.layers; ++l) {
      const std::string p = "layer" + std::to_string(l) + ".";
      LayerWeights w;
      w.norm1 = norm_param(p + "attention.norm");
      w.norm1_bias = norm_bias(p + "attention.norm");
      if (s_.qkv == QkvLayout::fused) {
        w.qkv = param(h_ * (h_ + 2 * kv_), p + "attention.qkv");
        w.qkv_bias = bias(h_ + 2 * kv_, p + "attention.qkv");
      } else {
        w.q = param(h_ * h_, p + "attention.q");
        w.q_bias = bias(h_, p + "attention.q");
        w.k = param(h_ * kv_, p + "attention.k");
        w.k_bias = bias(kv_, p + "attention.k");
        w.v = param(h_ * kv_, p + "attention.v");
        w.v_bias = bias(kv_, p + "attention.v");
      }
      w.o = param(h_ * h_, p + "attention.out");
      w.o_bias = bias(h_, p + "attention.out");
      w.norm2 = norm_param(p + "mlp.norm");
      w.norm2_bias = norm_bias(p + "mlp.norm");
      if (m.mlp == MlpKind::gated) w.gate = param(h_ * m.ffn, p + "mlp.gate");
      w.up = param(h_ * m.ffn, p + (m.mlp == MlpKind::gated ? "mlp.up" : "mlp.fc1"));
      w.up_bias = bias(m.ffn, p + "mlp.fc1");
      w.down = param(m.ffn * h_, p + (m.mlp == MlpKind::gated ? "mlp.down" : "mlp.fc2"));
      w.down_bias = bias(h_, p + "mlp.fc2");
      layers_.push_back(w);
    }
    final_norm_ = norm_param("final_norm");
    final_norm_bias_ = norm_bias("final_norm");
    head_ = m.tied_embeddings ? embedding_ : param(m.vocab * h_, "lm_head");
    if (m.positions == 0) {  // rotary: cos and sin buffers of the context, in the parameters' dtype
      const std::uint64_t half = m.head_dim() / 2;  // (fp32 under autocast; model.to(dtype) casts them)
      rope_cos_ = a_.constant(m.context * half, param_dtype_, "weights:rope.cos");
      rope_sin_ = a_.constant(m.context * half, param_dtype_, "weights:rope.sin");
    }
    const bool mixed = s_.precision == Precision::bf16 || s_.precision == Precision::fp16;
    if (mixed && s_.mode == Mode::training)  // fp32 master weights
      for (Var p : params_) master_.push_back(a_.raw_alloc(4 * a_.elements(p), "optimizer:master"));
  }

  // --- ops -----------------------------------------------------------------------------------

  // x [rows x in] @ W^T (+ bias): mm saves its input for W's gradient and W for the input's.
  Var linear(Var x, Var w, Var bias, std::uint64_t rows, std::uint64_t out, const std::string& label) {
    Var weight = w;
    Var b = bias;
    if (autocast()) {
      weight = a_.cached_cast(w, low_dtype());
      if (b) b = a_.cached_cast(bias, low_dtype());
    }
    Var in = autocast_input(x, low_dtype(), label + ".input");
    Var y = a_.op({.label = label, .inputs = {in, weight, b}, .saved = {in, weight}}, rows * out, matmul_dtype(x));
    release_input(in, x);
    return y;
  }

  // Elementwise: out of `elements`, dtype promoted from the inputs.
  Var binary(const std::string& label, Var x, Var y, std::uint64_t elements, std::vector<Var> saved,
             GradFlow flow = GradFlow::compute, std::uint64_t temporary = 0) {
    return a_.op({.label = label, .inputs = {x, y}, .saved = std::move(saved), .flow = flow, .backward_temporary = temporary},
                 elements, promote(a_.dtype(x), a_.dtype(y)));
  }
  Var add(const std::string& label, Var x, Var y) {
    return binary(label, x, y, std::max(a_.elements(x), a_.elements(y)), {}, GradFlow::passthrough);
  }
  Var unary(const std::string& label, Var x, std::vector<Var> saved, bool saves_result, std::uint64_t elements = 0) {
    return a_.op({.label = label, .inputs = {x}, .saved = std::move(saved), .saves_result = saves_result},
                 elements == 0 ? a_.elements(x) : elements, a_.dtype(x));
  }

  // RMSNorm written out (as Llama's and the CS336 handout's are): x * rsqrt(mean(x^2) + eps) * w.
  // LayerNorm: F.layer_norm (fp32 under autocast), saving its input, mean and rstd.
  Var norm(Var x, Var w, Var bias, std::uint64_t rows, const std::string& label) {
    if (s_.model.norm == NormKind::layernorm) {
      Var in = fp32_input(x, label);
      Var stats = a_.op({.label = label + ".stats", .inputs = {}}, 2 * rows, DType::f32);
      Var y = a_.op({.label = label, .inputs = {in, w, bias}, .saved = {in, w, bias, stats},
                     .backward_temporary = 2 * rows * h_ * 4},
                    rows * h_, autocast() ? DType::f32 : a_.dtype(x));
      a_.drop(stats);
      release_input(in, x);
      return y;
    }
    const std::uint64_t n = rows * h_;
    const std::uint64_t el = dtype_bytes(a_.dtype(x));
    Var sq = unary(label + ".pow", x, {x}, false);
    Var mean = unary(label + ".mean", sq, {}, false, rows);
    a_.drop(sq);
    Var eps = a_.op({.label = label + ".eps", .inputs = {mean}, .flow = GradFlow::passthrough}, rows, a_.dtype(mean));
    a_.drop(mean);
    Var rstd = unary(label + ".rsqrt", eps, {}, true);
    a_.drop(eps);
    Var xn = binary(label + ".normed", x, rstd, n, {x, rstd}, GradFlow::compute, n * el);
    a_.drop(rstd);
    Var y = binary(label, xn, w, n, {xn, w}, GradFlow::compute, n * el);
    a_.drop(xn);
    return y;
  }

  // Rotary embedding written out on halves: [x1 cos - x2 sin, x1 sin + x2 cos] (cos and sin are
  // fp32 buffers: the result is fp32 under autocast, by type promotion).
  Var rope(Var x, const std::string& label) {
    if (!rope_cos_) return x;
    const std::uint64_t half = a_.elements(x) / 2;
    std::vector<Var> halves = a_.split(x, {half, half}, label + ".halves");
    Var a = binary(label + ".rope", halves[0], rope_cos_, half, {rope_cos_});
    Var b = binary(label + ".rope", halves[1], rope_sin_, half, {rope_sin_});
    Var first = binary(label + ".rope", a, b, half, {});
    a_.drop(a);
    a_.drop(b);
    Var c = binary(label + ".rope", halves[0], rope_sin_, half, {rope_sin_});
    Var d = binary(label + ".rope", halves[1], rope_cos_, half, {rope_cos_});
    Var second = add(label + ".rope", c, d);
    a_.drop(c);
    a_.drop(d);
    a_.drop(halves[0]);
    a_.drop(halves[1]);
    Var out = a_.op({.label = label + ".rotated", .inputs = {first, second}, .flow = GradFlow::passthrough},
                    2 * half, a_.dtype(first));
    a_.drop(first);
    a_.drop(second);
    return out;
  }

  // A tensor an op makes beside its output for its backward (a mask, indices, a log-sum-exp): kept
  // while grad is on, a temporary otherwise.
  Var aux(std::uint64_t elements, DType dtype, const std::string& name) {
    return a_.constant(elements, dtype, (a_.grad_enabled() ? "activations:" : "temporaries:") + name);
  }

  Var dropout(Var x, const std::string& label) {
    if (!s_.model.dropout || !a_.grad_enabled()) return x;
    Var mask = aux(a_.elements(x), DType::b8, label + ".dropout_mask");
    Var y = a_.op({.label = label + ".dropout", .inputs = {x}, .saved = {mask}}, a_.elements(x), a_.dtype(x));
    a_.drop(mask);
    return y;
  }

  // Grouped-query attention's K or V repeated to every head (repeat_kv: expand and reshape, a copy).
  Var repeat_kv(Var x, std::uint64_t tokens, const std::string& label) {
    if (kv_ == h_) return x;
    Var y = a_.op({.label = label + ".repeat_kv", .inputs = {x}, .backward_temporary = tokens * h_ * dtype_bytes(a_.dtype(x))},
                  tokens * h_, a_.dtype(x));
    a_.drop(x);
    return y;
  }

  // A 4-D matmul's operand with transposed heads: copied contiguous (torch.matmul's reshape), in
  // 16 bits under autocast (cast first, the cast a temporary). The caller drops the copy.
  Var matmul_operand(Var x, const std::string& label) {
    Var in = autocast_input(x, low_dtype(), label);
    Var copy = a_.op({.label = label + "_contiguous", .inputs = {in}, .flow = GradFlow::passthrough}, a_.elements(in), a_.dtype(in));
    release_input(in, x);
    return copy;
  }

  // Attention written out (scores, causal mask, softmax as x - max, exp, / sum), what the CS336
  // handout asks for and eager "attn_implementation" runs. Variables live as Python keeps them: an
  // expression's temporaries go at once, a rebound variable's old tensor when the new one exists,
  // a function's locals when it returns (the masked scores: at the end of attention).
  Var eager_attention(Var q, Var k, Var v, const Shape& sh, const std::string& label) {
    const std::uint64_t square = sh.batch * heads_ * sh.seq * sh.seq;
    const std::uint64_t rows = sh.batch * heads_ * sh.seq;
    // Q and K^T with their heads transposed to [b, heads, s, d] are not contiguous: matmul copies
    // them (in 16 bits under autocast, after its cast) and keeps the copies, not Q and K.
    Var qc = matmul_operand(q, label + ".q");
    Var kc = matmul_operand(k, label + ".k");
    Var raw = a_.op({.label = label + ".scores", .inputs = {qc, kc}, .saved = {qc, kc}}, square, matmul_dtype(q));
    a_.drop(qc);
    a_.drop(kc);
    Var scaled = unary(label + ".scaled", raw, {}, false);
    a_.drop(raw);
    Var mask = aux(sh.seq * sh.seq, DType::b8, label + ".causal_mask");
    Var masked = a_.op({.label = label + ".masked", .inputs = {scaled}, .saved = {mask}}, square, a_.dtype(scaled));
    a_.drop(mask);
    a_.drop(scaled);
    Var indices = aux(rows, DType::i64, label + ".max_indices");
    Var max = a_.op({.label = label + ".max", .inputs = {masked}, .saved = {indices}}, rows, a_.dtype(masked));
    a_.drop(indices);
    Var shifted = binary(label + ".shifted", masked, max, square, {});
    a_.drop(max);
    Var in = fp32_input(shifted, label + ".exp");
    Var exp = unary(label + ".exp", in, {}, true);
    release_input(in, shifted);
    Var sum = unary(label + ".sum", exp, {}, false, rows);
    Var probs = binary(label + ".probs", exp, sum, square, {exp, sum}, GradFlow::compute, square * 4);
    a_.drop(sum);
    // The softmax function returns: its locals (x - max, exp) go; the caller's scores live on
    // until the attention function returns.
    a_.drop(shifted);
    a_.drop(exp);
    Var dropped = dropout(probs, label + ".probs");
    if (dropped.id != probs.id) a_.drop(probs);
    Var pc = autocast_input(dropped, low_dtype(), label + ".probs");
    // probs @ V: V's transposed heads are copied too (V itself, or the fused QKV output it is a
    // view of, can go).
    Var vc = matmul_operand(v, label + ".v");
    Var ctx = a_.op({.label = label + ".context", .inputs = {pc, vc}, .saved = {pc, vc}}, sh.tokens() * h_, matmul_dtype(dropped));
    a_.drop(vc);
    release_input(pc, dropped);
    a_.drop(dropped);
    a_.drop(masked);
    return ctx;
  }

  // F.scaled_dot_product_attention / flash-attn: flash (16-bit inputs) or memory-efficient (fp32)
  // kernels keep q, k, v, the output and a log-sum-exp per row; their backward allocates an fp32
  // accumulator of dq and one float per row.
  Var fused_attention(Var q, Var k, Var v, const Shape& sh, const std::string& label) {
    Var qc = autocast_input(q, low_dtype(), label + ".q");
    Var kc = autocast_input(k, low_dtype(), label + ".k");
    Var vc = autocast_input(v, low_dtype(), label + ".v");
    const std::uint64_t rows = sh.batch * heads_ * ((sh.seq + 31) / 32 * 32);
    Var lse = aux(rows, DType::f32, label + ".lse");
    Var out = a_.op({.label = label + ".context", .inputs = {qc, kc, vc}, .saved = {qc, kc, vc, lse},
                     .backward_temporary = sh.tokens() * h_ * 4 + rows * 4, .saves_result = true},
                    sh.tokens() * h_, matmul_dtype(q));
    a_.drop(lse);
    release_input(qc, q);
    release_input(kc, k);
    release_input(vc, v);
    return out;
  }

  Var attention(Var x, const LayerWeights& w, const Shape& sh, const std::string& label) {
    const std::uint64_t T = sh.tokens();
    Var q, k, v;
    if (w.qkv) {
      Var qkv = linear(x, w.qkv, w.qkv_bias, T, h_ + 2 * kv_, label + ".qkv");
      std::vector<Var> parts = a_.split(qkv, {T * h_, T * kv_, T * kv_}, label + ".qkv_split");
      a_.drop(qkv);
      q = parts[0], k = parts[1], v = parts[2];
    } else {
      q = linear(x, w.q, w.q_bias, T, h_, label + ".q");
      k = linear(x, w.k, w.k_bias, T, kv_, label + ".k");
      v = linear(x, w.v, w.v_bias, T, kv_, label + ".v");
    }
    Var qr = rope(q, label + ".q");
    if (qr.id != q.id) a_.drop(q);
    Var kr = rope(k, label + ".k");
    if (kr.id != k.id) a_.drop(k);
    kr = repeat_kv(kr, T, label + ".k");
    v = repeat_kv(v, T, label + ".v");
    Var ctx = s_.attention == Attention::eager ? eager_attention(qr, kr, v, sh, label)
                                               : fused_attention(qr, kr, v, sh, label);
    a_.drop(qr);
    a_.drop(kr);
    a_.drop(v);
    // [b, heads, s, d] back to [b, s, h]: a copy after the written-out matmul with V; the fused
    // kernels' output is laid out [b, s, heads, d] already (its transpose back is a view).
    if (s_.attention == Attention::eager) {
      Var merged = a_.op({.label = label + ".merge_heads", .inputs = {ctx}, .flow = GradFlow::passthrough}, T * h_, a_.dtype(ctx));
      a_.drop(ctx);
      ctx = merged;
    }
    Var out = linear(ctx, w.o, w.o_bias, T, h_, label + ".out");
    a_.drop(ctx);
    return out;
  }

  Var activation(Var x, const std::string& label) {
    if (s_.activation == ActivationOps::fused)  // F.silu / F.gelu keep their input
      return unary(label, x, {x}, false);
    if (s_.model.mlp == MlpKind::gated) {  // x * sigmoid(x)
      Var sig = unary(label + ".sigmoid", x, {}, true);
      Var y = binary(label, x, sig, a_.elements(x), {x, sig});
      a_.drop(sig);
      return y;
    }
    // GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): x^3 (keeps x), the inner
    // sum, tanh (kept), 1 + tanh, 0.5 x, and their product (keeps both) are each of x's size.
    Var cube = unary(label + ".cube", x, {x}, false);
    Var inner = binary(label + ".inner", x, cube, a_.elements(x), {});
    a_.drop(cube);
    Var t = unary(label + ".tanh", inner, {}, true);
    a_.drop(inner);
    Var one = unary(label + ".one_plus", t, {}, false);
    a_.drop(t);
    Var half = unary(label + ".half", x, {}, false);
    Var y = binary(label, half, one, a_.elements(x), {half, one});
    a_.drop(one);
    a_.drop(half);
    return y;
  }

  Var mlp(Var x, const LayerWeights& w, const Shape& sh, const std::string& label) {
    const std::uint64_t T = sh.tokens();
    const std::uint64_t f = s_.model.ffn;
    if (s_.model.mlp == MlpKind::gated) {
      Var gate = linear(x, w.gate, Var{}, T, f, label + ".gate");
      Var act = activation(gate, label + ".silu");
      a_.drop(gate);
      Var up = linear(x, w.up, w.up_bias, T, f, label + ".up");
      Var product = binary(label + ".product", act, up, T * f, {act, up});
      a_.drop(act);
      a_.drop(up);
      Var down = linear(product, w.down, w.down_bias, T, h_, label + ".down");
      a_.drop(product);
      return down;
    }
    Var fc1 = linear(x, w.up, w.up_bias, T, f, label + ".fc1");
    Var act = activation(fc1, label + ".gelu");
    a_.drop(fc1);
    Var fc2 = linear(act, w.down, w.down_bias, T, h_, label + ".fc2");
    a_.drop(act);
    return fc2;
  }

  Var layer(Var x, std::size_t l, const Shape& sh) {
    const LayerWeights& w = layers_[l];
    const std::uint64_t T = sh.tokens();
    Var n1 = norm(x, w.norm1, w.norm1_bias, T, "attention.norm");
    Var attn = attention(n1, w, sh, "attention");
    a_.drop(n1);
    Var attn_out = dropout(attn, "attention.output");
    if (attn_out.id != attn.id) a_.drop(attn);
    Var h = add("residual", x, attn_out);
    a_.drop(attn_out);
    Var n2 = norm(h, w.norm2, w.norm2_bias, T, "mlp.norm");
    Var m = mlp(n2, w, sh, "mlp");
    a_.drop(n2);
    Var m_out = dropout(m, "mlp.output");
    if (m_out.id != m.id) a_.drop(m);
    // A checkpointed layer's output is what the next layer's checkpoint keeps.
    Var out = add(in_checkpoint_ ? "activations:checkpoint.layer_output" : "layer_output", h, m_out);
    a_.drop(h);
    a_.drop(m_out);
    return out;
  }

  struct CheckpointContext {
    TorchLoop* loop;
    std::size_t layer;
    Shape shape;
  };
  // The recompute runs under the autocast state of the forward pass (torch.utils.checkpoint
  // restores it): a context of its own, whose cast cache goes when the recomputed forward ends.
  static Var recompute_layer(void* context, Autograd& a, Var input) {
    auto* c = static_cast<CheckpointContext*>(context);
    const bool autocast = c->loop->autocast();
    if (autocast) a.enter_autocast();
    Var y = c->loop->layer(input, c->layer, c->shape);
    if (autocast) a.exit_autocast();
    return y;
  }

  // torch.utils.checkpoint around each layer: its forward without saving anything, its input kept;
  // the backward runs the layer again with grad on.
  Var checkpointed_layer(Var x, std::size_t l, const Shape& sh) {
    a_.set_grad_enabled(false);
    in_checkpoint_ = true;
    Var out = layer(x, l, sh);
    in_checkpoint_ = false;
    a_.set_grad_enabled(true);
    checkpoints_.push_back(std::make_unique<CheckpointContext>(CheckpointContext{this, l, sh}));
    return a_.checkpoint(x, out, &TorchLoop::recompute_layer, checkpoints_.back().get(), "checkpoint");
  }

  Var model_forward(const Shape& sh) {
    const std::uint64_t T = sh.tokens();
    Var x = a_.op({.label = "embedding", .inputs = {embedding_}, .saved = {ids_}}, T * h_, param_dtype_);
    if (positions_) {
      Var pos = a_.op({.label = "embedding.positions", .inputs = {positions_}}, T * h_, param_dtype_);
      Var sum = add("embedding.sum", x, pos);
      a_.drop(x);
      a_.drop(pos);
      x = sum;
    }
    Var d = dropout(x, "embedding");
    if (d.id != x.id) a_.drop(x);
    x = d;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const bool ckpt = s_.checkpointing == Checkpointing::full && a_.grad_enabled();
      Var y = ckpt ? checkpointed_layer(x, l, sh) : layer(x, l, sh);
      a_.drop(x);
      x = y;
    }
    Var n = norm(x, final_norm_, final_norm_bias_, T, "final_norm");
    a_.drop(x);
    Var logits = linear(n, head_, Var{}, T, s_.model.vocab, "loss:logits");
    a_.drop(n);
    return logits;
  }

  // F.cross_entropy (log_softmax in fp32, kept; nll_loss), or written out: max, x - max,
  // exp (kept), sum, log, gather, mean.
  Var loss(Var logits, const Shape& sh) {
    const std::uint64_t T = sh.tokens();
    const std::uint64_t n = T * s_.model.vocab;
    Var targets = a_.constant(T, DType::i64, "inputs:targets");
    Var out;
    if (s_.loss == LossOps::cross_entropy) {
      Var in = fp32_input(logits, "loss");
      Var ls = a_.op({.label = "loss:log_softmax", .inputs = {in}, .saves_result = true}, n,
                     autocast() ? DType::f32 : a_.dtype(logits));
      release_input(in, logits);
      out = a_.op({.label = "loss:value", .inputs = {ls}, .saved = {targets}}, 1, DType::f32);
      a_.drop(ls);
    } else {
      Var indices = a_.constant(T, DType::i64, "loss:max_indices");
      Var max = a_.op({.label = "loss:max", .inputs = {logits}, .saved = {indices}}, T, a_.dtype(logits));
      a_.drop(indices);
      Var shifted = binary("loss:shifted", logits, max, n, {});
      a_.drop(max);
      Var in = fp32_input(shifted, "loss:exp");
      Var exp = unary("loss:exp", in, {}, true);
      release_input(in, shifted);
      Var sum = unary("loss:sum", exp, {}, false, T);
      a_.drop(exp);
      Var log = unary("loss:log", sum, {sum}, false);
      a_.drop(sum);
      // gather keeps its input too (its backward reads it: derivatives.yaml, gather_backward)
      Var picked = a_.op({.label = "loss:picked", .inputs = {shifted}, .saved = {shifted, targets}}, T, a_.dtype(shifted));
      a_.drop(shifted);
      Var diff = binary("loss:diff", log, picked, T, {});
      a_.drop(log);
      a_.drop(picked);
      out = unary("loss:value", diff, {}, false, 1);
      a_.drop(diff);
    }
    a_.drop(targets);
    return out;
  }

  void drop_inputs() { a_.drop(ids_); }

  void micro_batch(const Shape& sh) {
    drop_inputs();
    ids_ = a_.constant(sh.tokens(), DType::i64, "inputs:input_ids");
    if (autocast()) a_.enter_autocast();
    Var logits = model_forward(sh);
    a_.drop(logits_);  // rebinding `logits`
    logits_ = logits;
    Var l = loss(logits_, sh);
    a_.drop(loss_);
    loss_ = l;
    if (autocast()) a_.exit_autocast();
    a_.backward(loss_);
  }

  // --- the optimizer -----------------------------------------------------------------------

  // Bytes per element of the optimizer's tensors of parameter p: p's dtype, or fp32 beside a master copy.
  std::uint64_t optimizer_element_bytes(Var p) const { return master_.empty() ? dtype_bytes(a_.dtype(p)) : 4; }
  // A tensor the size of parameter p in the optimizer's precision.
  std::uint64_t master_bytes(Var p) const { return a_.elements(p) * optimizer_element_bytes(p); }
  // One AdamW moment of p (layout.hpp's moment_bytes).
  std::uint64_t state_bytes(Var p) const { return moment_bytes(s_, a_.elements(p), optimizer_element_bytes(p)); }

  // States are created at the first step (torch.optim's _init_group, bitsandbytes' init_state).
  void create_states() {
    for (Var p : params_) {
      if (s_.optimizer == Optimizer::sgd) {  // momentum_buffer = clone(grad)
        exp_avg_.push_back(a_.raw_alloc(master_bytes(p), "optimizer:momentum"));
        continue;
      }
      exp_avg_.push_back(a_.raw_alloc(state_bytes(p), "optimizer:exp_avg"));
      exp_avg_sq_.push_back(a_.raw_alloc(state_bytes(p), "optimizer:exp_avg_sq"));
      if (s_.optimizer_impl == OptimizerImpl::fused) steps_.push_back(a_.raw_alloc(4, "optimizer:step"));
    }
  }

  void clip_gradients() {  // clip_grad_norm_ (foreach): a norm per gradient, stacked, the total
    std::vector<std::uint32_t> norms;
    for (std::size_t i = 0; i < params_.size(); ++i) norms.push_back(a_.raw_alloc(4, "temporaries:clip.norm"));
    const std::uint32_t stacked = a_.raw_alloc(4 * params_.size(), "temporaries:clip.stacked");
    const std::uint32_t total = a_.raw_alloc(4, "temporaries:clip.total");
    for (std::uint32_t n : norms) a_.raw_free(n);
    a_.raw_free(stacked);
    a_.raw_free(total);
  }

  // One tensor of `bytes` allocated and freed by each parameter's update, `live` of them at once.
  void per_param_temporaries(int live, const std::string& label) {
    for (Var p : params_) {
      std::vector<std::uint32_t> t;
      for (int i = 0; i < live; ++i) t.push_back(a_.raw_alloc(master_bytes(p), label));
      for (std::uint32_t x : t) a_.raw_free(x);
    }
  }

  // The hand-written AdamW of the CS336 runs: m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g^2 as
  // new tensors (the old ones freed when rebound), then p -= lr m / (sqrt(v) + eps).
  void handwritten_update() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::uint64_t n = master_bytes(params_[i]);
      const auto alloc = [&](const char* label) { return a_.raw_alloc(n, label); };
      std::uint32_t t1 = alloc("temporaries:optimizer.update");
      std::uint32_t t2 = alloc("temporaries:optimizer.update");
      std::uint32_t m = alloc("optimizer:exp_avg");
      a_.raw_free(t1);
      a_.raw_free(t2);
      a_.raw_free(exp_avg_[i]);
      exp_avg_[i] = m;
      t1 = alloc("temporaries:optimizer.update");  // g^2
      t2 = alloc("temporaries:optimizer.update");  // (1 - b2) g^2
      a_.raw_free(t1);
      std::uint32_t t3 = alloc("temporaries:optimizer.update");  // b2 v
      std::uint32_t v = alloc("optimizer:exp_avg_sq");
      a_.raw_free(t3);
      a_.raw_free(t2);
      a_.raw_free(exp_avg_sq_[i]);
      exp_avg_sq_[i] = v;
      t1 = alloc("temporaries:optimizer.update");  // lr m
      t2 = alloc("temporaries:optimizer.update");  // sqrt(v)
      t3 = alloc("temporaries:optimizer.update");  // sqrt(v) + eps
      a_.raw_free(t2);
      std::uint32_t t4 = alloc("temporaries:optimizer.update");  // the quotient
      a_.raw_free(t1);
      a_.raw_free(t3);
      a_.raw_free(t4);
    }
  }

  void optimizer_step(bool first) {
    if (first) create_states();
    if (s_.clip_grad) clip_gradients();
    if (!master_.empty()) per_param_temporaries(1, "temporaries:optimizer.grad_fp32");
    if (s_.optimizer != Optimizer::adamw) return;  // sgd (foreach, in place) and 8-bit AdamW: no temporaries
    switch (s_.optimizer_impl) {
      case OptimizerImpl::fused: return;
      case OptimizerImpl::for_loop: per_param_temporaries(2, "temporaries:optimizer.denom"); return;
      case OptimizerImpl::handwritten: handwritten_update(); return;
      case OptimizerImpl::foreach: {  // _foreach_sqrt(exp_avg_sqs): a new tensor per state, all at once
        std::vector<std::uint32_t> t;
        for (Var p : params_) t.push_back(a_.raw_alloc(master_bytes(p), "temporaries:optimizer.foreach_sqrt"));
        for (std::uint32_t x : t) a_.raw_free(x);
        return;
      }
    }
  }

  const WorkloadSetup& s_;
  TraceBuilder& b_;
  Autograd a_;
  std::uint64_t h_ = 0, kv_ = 0, heads_ = 0;
  DType param_dtype_ = DType::f32;
  std::vector<Var> params_;
  std::vector<std::uint32_t> master_, exp_avg_, exp_avg_sq_, steps_;
  Var embedding_, positions_, final_norm_, final_norm_bias_, head_, rope_cos_, rope_sin_;
  std::vector<LayerWeights> layers_;
  std::vector<std::unique_ptr<CheckpointContext>> checkpoints_;
  Var ids_, logits_, loss_;
  bool in_checkpoint_ = false;  // a checkpointed layer's first forward pass (grad off)
};

}  // namespace

trace::Trace generate_torch_trace(const WorkloadSetup& s) {
  trace::Trace t;
  TraceBuilder b(t);
  TorchLoop loop(s, b);
  const auto lengths = micro_batch_lengths(s);
  if (s.mode == Mode::forward) loop.forward_passes(lengths);
  else loop.train(lengths);
  return t;
}

}  // namespace tensorpool::workload
