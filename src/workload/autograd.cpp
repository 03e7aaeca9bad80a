// autograd.cpp: storages, nodes and the backward pass of the eager-mode emulation (autograd.hpp).
#include "autograd.hpp"

#include <cassert>

namespace tensorpool::workload {

std::uint64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::u8:
    case DType::b8: return 1;
  }
  return 4;
}

bool is_low_float(DType t) { return t == DType::f16 || t == DType::bf16; }

DType promote(DType a, DType b) {
  if (a == DType::f32 || b == DType::f32) return DType::f32;
  return is_low_float(a) ? a : b;
}

// --- storages and values --------------------------------------------------------------------

std::uint32_t Autograd::new_storage(std::uint64_t bytes, const std::string& label) {
  storages_.push_back({b_.alloc(bytes, label), 1});
  return static_cast<std::uint32_t>(storages_.size() - 1);
}

void Autograd::unref(std::uint32_t storage) {
  Storage& s = storages_[storage];
  assert(s.refs > 0);
  if (--s.refs == 0) b_.free(s.addr);
}

Var Autograd::new_value(std::uint32_t storage, std::uint64_t elements, DType dtype, bool requires_grad) {
  values_.push_back({storage, elements, dtype, requires_grad, -1, kNone});
  return Var{static_cast<std::int32_t>(values_.size() - 1)};
}

bool Autograd::any_requires_grad(const std::vector<Var>& vs) const {
  for (Var v : vs)
    if (v && values_[idx(v)].requires_grad) return true;
  return false;
}

Var Autograd::parameter(std::uint64_t elements, DType dtype, const std::string& name, bool trainable) {
  const std::uint32_t s = new_storage(elements * dtype_bytes(dtype), "weights:" + name);
  Var v = new_value(s, elements, dtype, trainable);
  values_[idx(v)].param = static_cast<std::int32_t>(params_.size());
  params_.push_back({v, name, kNone});
  return v;
}

Var Autograd::constant(std::uint64_t elements, DType dtype, const std::string& label) {
  return new_value(new_storage(elements * dtype_bytes(dtype), label), elements, dtype, false);
}

void Autograd::drop(Var& v) {
  if (!v) return;
  unref(values_[idx(v)].storage);
  v = Var{};
}

// --- ops ------------------------------------------------------------------------------------

Var Autograd::op(const OpSpec& spec, std::uint64_t elements, DType dtype) {
  const bool records = grad_ && any_requires_grad(spec.inputs);
  const bool named = spec.label.find(':') != std::string::npos;
  const std::string label = named ? spec.label : (records ? "activations:" : "temporaries:") + spec.label;
  Var out = new_value(new_storage(elements * dtype_bytes(dtype), label), elements, dtype, records);
  if (!records) return out;
  Node n;
  n.label = spec.label;
  for (Var in : spec.inputs)
    if (in && values_[idx(in)].requires_grad) n.inputs.push_back(in.id);
  n.outputs.push_back(out.id);
  for (Var s : spec.saved) {
    if (!s) continue;
    ++storages_[values_[idx(s)].storage].refs;
    n.saved.push_back(values_[idx(s)].storage);
  }
  if (spec.saves_result) {
    ++storages_[values_[idx(out)].storage].refs;
    n.saved.push_back(values_[idx(out)].storage);
  }
  n.flow = spec.flow;
  n.backward_temporary = spec.backward_temporary;
  ops_.push_back(std::move(n));
  return out;
}

std::vector<Var> Autograd::split(Var base, const std::vector<std::uint64_t>& parts, const std::string& label) {
  const Value b = values_[idx(base)];
  const bool records = grad_ && b.requires_grad;
  std::vector<Var> out;
  Node n;
  n.label = label;
  n.inputs.push_back(base.id);
  n.flow = GradFlow::merge;
  for (std::uint64_t elements : parts) {
    ++storages_[b.storage].refs;
    out.push_back(new_value(b.storage, elements, b.dtype, records));
    n.outputs.push_back(out.back().id);
  }
  if (records) ops_.push_back(std::move(n));
  return out;
}

Var Autograd::cached_cast(Var p, DType dtype) {
  assert(autocast_);
  for (const auto& [param, cast] : cast_cache_)
    if (param == p.id) return cast;
  const std::string& name = params_[param_of(p)].name;
  Var c = op(OpSpec{.label = "autocast:" + name, .inputs = {p}}, elements(p), dtype);
  cast_cache_.emplace_back(p.id, c);
  return c;
}

Var Autograd::cast(Var v, DType dtype, const std::string& label) {
  return op(OpSpec{.label = label, .inputs = {v}}, elements(v), dtype);
}

void Autograd::exit_autocast() {
  for (auto& [param, cast] : cast_cache_) drop(cast);
  cast_cache_.clear();
  autocast_ = false;
}

Var Autograd::checkpoint(Var input, Var output, Recompute recompute, void* context, const std::string& label) {
  Value& out = values_[idx(output)];
  if (!grad_ || !values_[idx(input)].requires_grad) return output;
  out.requires_grad = true;
  Node n;
  n.label = label;
  n.inputs.push_back(input.id);
  n.outputs.push_back(output.id);
  ++storages_[values_[idx(input)].storage].refs;
  n.saved.push_back(values_[idx(input)].storage);
  n.recompute = recompute;
  n.context = context;
  ops_.push_back(std::move(n));
  return output;
}

// --- backward -------------------------------------------------------------------------------

std::uint32_t Autograd::grad_for(std::int32_t value, const std::string& label) {
  const Value& v = values_[static_cast<std::size_t>(value)];
  const std::uint64_t bytes = v.elements * dtype_bytes(v.dtype);
  if (v.param >= 0 && params_[static_cast<std::size_t>(v.param)].grad == kNone)
    return new_storage(bytes, "grads:" + params_[static_cast<std::size_t>(v.param)].name);
  return new_storage(bytes, "temporaries:backward." + label);
}

void Autograd::deliver(std::int32_t value, std::uint32_t grad) {
  Value& v = values_[static_cast<std::size_t>(value)];
  if (v.param >= 0) {  // AccumulateGrad: the first gradient becomes .grad, later ones are added in
    Param& p = params_[static_cast<std::size_t>(v.param)];
    if (p.grad == kNone) p.grad = grad;
    else unref(grad);
    return;
  }
  if (v.grad == kNone) v.grad = grad;
  else unref(grad);  // InputBuffer: added in place
}

void Autograd::run_node(std::size_t i) {
  if (ops_[i].done) return;
  ops_[i].done = true;
  const Node n = ops_[i];  // a copy: a checkpoint's recompute appends nodes
  std::vector<std::uint32_t> grads;
  for (std::int32_t o : n.outputs) {
    Value& v = values_[static_cast<std::size_t>(o)];
    if (v.grad != kNone) grads.push_back(v.grad);
    v.grad = kNone;
  }
  if (!grads.empty()) {
    if (n.recompute != nullptr) {
      run_checkpoint(i, grads.front());
      grads.clear();
    } else if (n.flow == GradFlow::passthrough) {
      for (std::int32_t in : n.inputs) {
        ++storages_[grads.front()].refs;
        deliver(in, grads.front());
      }
    } else {
      const std::uint32_t temp = n.backward_temporary > 0
                                     ? new_storage(n.backward_temporary, "temporaries:backward." + n.label)
                                     : kNone;
      for (std::int32_t in : n.inputs) deliver(in, grad_for(in, n.label));
      if (temp != kNone) unref(temp);
    }
  }
  for (std::uint32_t g : grads) unref(g);
  for (std::uint32_t s : n.saved) unref(s);
}

void Autograd::run_checkpoint(std::size_t i, std::uint32_t grad) {
  const std::int32_t input = ops_[i].inputs.front();
  const Value x = values_[static_cast<std::size_t>(input)];
  const bool was = grad_;
  grad_ = true;
  ++storages_[x.storage].refs;
  Var detached = new_value(x.storage, x.elements, x.dtype, true);
  const std::size_t begin = ops_.size();
  Var y = ops_[i].recompute(ops_[i].context, *this, detached);
  values_[idx(y)].grad = grad;
  run_nodes(begin);
  const std::uint32_t gx = values_[idx(detached)].grad;
  values_[idx(detached)].grad = kNone;
  drop(y);
  drop(detached);
  grad_ = was;
  if (gx != kNone) deliver(input, gx);
}

void Autograd::run_nodes(std::size_t begin) {
  for (std::size_t i = ops_.size(); i-- > begin;) run_node(i);
}

void Autograd::backward(Var loss) {
  values_[idx(loss)].grad = new_storage(bytes(loss), "temporaries:backward.grad_output");
  run_nodes(0);
  ops_.clear();  // every node has run
}

void Autograd::free_graph(std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end && i < ops_.size(); ++i) {
    Node& n = ops_[i];
    if (n.done) continue;
    n.done = true;
    for (std::uint32_t s : n.saved) unref(s);
    n.saved.clear();
  }
}

void Autograd::zero_grad() {
  for (Param& p : params_) {
    if (p.grad == kNone) continue;
    unref(p.grad);
    p.grad = kNone;
  }
}

std::uint32_t Autograd::raw_alloc(std::uint64_t bytes, const std::string& label) { return new_storage(bytes, label); }

}  // namespace tensorpool::workload
