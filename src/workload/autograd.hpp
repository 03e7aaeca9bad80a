// autograd.hpp: what PyTorch's eager mode allocates and frees while a program runs tensor ops, with
// autograd and autocast (internal to tensorpool::workload; the PyTorch loop of torch_loop.cpp is
// written on it).
//
// Only memory is modelled: a tensor is its element count and dtype, an op allocates its outputs
// and says which tensors autograd saves for its backward. The rules are PyTorch's:
// - a storage lives while something refers to it: the program (a Python variable: the handle an op
//   returns, released by drop()), autograd (a tensor saved by a node, released when the node's
//   backward has run or the graph is freed) or the autocast cast cache; views share the storage;
// - under no_grad nothing is saved and no node is recorded;
// - backward runs the nodes in reverse order of creation (a valid order for a program that runs
//   its ops one after another, as the engine's sequence numbers give it): a node gets the gradient
//   of its outputs, allocates the gradients of its inputs (and the temporaries it declares), then
//   releases its saved tensors and its output gradients (Engine::evaluate_function, with
//   retain_graph=False). A gradient reaching a tensor that already has one is added in place
//   (InputBuffer::accumulate); one reaching a parameter becomes its .grad the first time and is
//   added into it afterwards (AccumulateGrad);
// - autocast (torch.amp): the cast of a parameter to 16 bits is cached from its first use until
//   the autocast context exits (autocast_mode.cpp, cached_cast: leaves that require grad); other
//   tensors are cast again by every op that casts them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trace_builder.hpp"

namespace tensorpool::workload {

enum class DType : std::uint8_t { f32, f16, bf16, i64, u8, b8 };
std::uint64_t dtype_bytes(DType t);
bool is_low_float(DType t);  // f16 or bf16
/// The type of a binary op's result between two floating tensors (type promotion: f32 wins).
DType promote(DType a, DType b);

/// A tensor the program holds: an index into Autograd's values (-1: none).
struct Var {
  std::int32_t id = -1;
  explicit operator bool() const { return id >= 0; }
};

/// How a node's backward gives its inputs their gradients.
enum class GradFlow : std::uint8_t {
  compute,      // allocates each input's gradient (and any declared temporaries)
  passthrough,  // hands its output's gradient on unchanged (views, clone, add): allocates nothing
  merge,        // several outputs that are views of one input (split): one gradient of the input
};

struct OpSpec {
  std::string label;                    // what the allocation is ("attention.scores")
  std::vector<Var> inputs = {};         // the tensors it reads (gradients flow to those that need them)
  std::vector<Var> saved = {};          // what autograd keeps for backward (when grad is on)
  GradFlow flow = GradFlow::compute;
  std::uint64_t backward_temporary = 0; // bytes its backward allocates and frees besides the gradients
  bool saves_result = false;            // autograd keeps the output too (exp, sigmoid, rsqrt, softmax)
};

class Autograd {
 public:
  /// Labels: `kept` prefixes what autograd saves ("activations:"), other outputs are
  /// "temporaries:" (their python variable is dropped soon); gradients of parameters are "grads:",
  /// other gradients "temporaries:backward.".
  explicit Autograd(TraceBuilder& b) : b_(b) {}

  /// A parameter of `elements` in `dtype`, allocated now ("weights:" + name).
  Var parameter(std::uint64_t elements, DType dtype, const std::string& name, bool trainable);
  /// A tensor that needs no gradient, allocated now with `label` (input ids, a causal mask).
  Var constant(std::uint64_t elements, DType dtype, const std::string& label);

  /// Runs an op: allocates its output of `elements` in `dtype` and records its node when grad
  /// mode is on and an input requires grad. The program holds the result until drop().
  Var op(const OpSpec& spec, std::uint64_t elements, DType dtype);
  /// Views of `base` of `parts` elements each (split, chunk, slices): one node whose backward
  /// allocates the base's gradient.
  std::vector<Var> split(Var base, const std::vector<std::uint64_t>& parts, const std::string& label);
  /// The program lets go of `v` (its variable goes out of scope or is rebound).
  void drop(Var& v);

  /// autocast's cast of parameter `p` to `dtype`: cached while autocast is entered (the cache
  /// keeps it), a plain cast op otherwise. The caller does not drop() the result.
  Var cached_cast(Var p, DType dtype);
  /// A cast of a non-parameter (a new tensor each time); the caller drops it.
  Var cast(Var v, DType dtype, const std::string& label);
  void enter_autocast() { autocast_ = true; }
  /// Leaves the autocast context: the cache lets go of its casts (the graph may still hold them).
  void exit_autocast();
  bool autocast() const { return autocast_; }

  void set_grad_enabled(bool on) { grad_ = on; }
  bool grad_enabled() const { return grad_; }
  bool requires_grad(Var v) const { return values_[idx(v)].requires_grad; }
  DType dtype(Var v) const { return values_[idx(v)].dtype; }
  std::uint64_t elements(Var v) const { return values_[idx(v)].elements; }
  std::uint64_t bytes(Var v) const { return values_[idx(v)].elements * dtype_bytes(values_[idx(v)].dtype); }

  /// The number of nodes recorded so far: a mark for free_graph(), until backward() clears them.
  std::size_t mark() const { return ops_.size(); }
  /// loss.backward(): the gradient of `loss` (ones, allocated), then every node not yet run, last
  /// first.
  void backward(Var loss);
  /// The graph of the nodes in [begin, end) is no longer reachable: their saved tensors go.
  void free_graph(std::size_t begin, std::size_t end);

  /// Activation checkpointing (torch.utils.checkpoint): a node over `input` that saves only it;
  /// its backward calls `recompute` with a detached copy of the input (grad on), runs the backward
  /// of what that recorded from the gradient of its result, and hands on the gradient that
  /// reached the copy.
  using Recompute = Var (*)(void* context, Autograd& a, Var input);
  Var checkpoint(Var input, Var output, Recompute recompute, void* context, const std::string& label);

  /// optimizer.zero_grad(set_to_none=True): every parameter's .grad freed.
  void zero_grad();

  /// An allocation outside the graph (an optimizer's state or temporary) and its release.
  std::uint32_t raw_alloc(std::uint64_t bytes, const std::string& label);
  void raw_free(std::uint32_t storage) { unref(storage); }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  struct Storage {
    std::uint64_t addr = 0;
    int refs = 0;
  };
  struct Value {
    std::uint32_t storage = kNone;
    std::uint64_t elements = 0;
    DType dtype = DType::f32;
    bool requires_grad = false;
    std::int32_t param = -1;         // a parameter leaf: its index in params_
    std::uint32_t grad = kNone;      // during backward: its gradient's storage
  };
  struct Param {
    Var value;
    std::string name;
    std::uint32_t grad = kNone;
  };
  struct Node {
    std::string label;
    std::vector<std::int32_t> inputs;   // values that require grad
    std::vector<std::int32_t> outputs;
    std::vector<std::uint32_t> saved;   // storages
    GradFlow flow = GradFlow::compute;
    std::uint64_t backward_temporary = 0;
    Recompute recompute = nullptr;      // a checkpoint
    void* context = nullptr;
    bool done = false;
  };

  std::size_t idx(Var v) const { return static_cast<std::size_t>(v.id); }
  std::size_t param_of(Var p) const { return static_cast<std::size_t>(values_[idx(p)].param); }
  std::uint32_t new_storage(std::uint64_t bytes, const std::string& label);
  void unref(std::uint32_t storage);
  Var new_value(std::uint32_t storage, std::uint64_t elements, DType dtype, bool requires_grad);
  bool any_requires_grad(const std::vector<Var>& vs) const;
  void run_node(std::size_t node);
  void run_checkpoint(std::size_t node, std::uint32_t grad);
  void run_nodes(std::size_t begin);
  void deliver(std::int32_t value, std::uint32_t grad);
  std::uint32_t grad_for(std::int32_t value, const std::string& label);

  TraceBuilder& b_;
  std::vector<Storage> storages_;
  std::vector<Value> values_;
  std::vector<Param> params_;
  std::vector<Node> ops_;
  std::vector<std::pair<std::int32_t, Var>> cast_cache_;  // (param value, its cast)
  bool grad_ = true;
  bool autocast_ = false;
};

}  // namespace tensorpool::workload
