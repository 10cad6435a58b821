// The Autograd kernel and its node (see Note [Autograd kernel]).
#include "autograd.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "../core/schema.h"

namespace opforge::torch {
namespace {

/// What holds an autograd node of type N: std::shared_ptr in torch releases whose Node is not
/// reference-counted in itself (2.10 to 2.14), c10::intrusive_ptr in those where it is (2.15);
/// set_history and rebase_history take the one their torch uses.
template <class N>
using NodePtr =
    std::conditional_t<std::is_base_of_v<c10::intrusive_ptr_target, N>, c10::intrusive_ptr<N>, std::shared_ptr<N>>;

/// A new node of type N: shared_ptr nodes are freed through deleteNode (found by argument-dependent
/// lookup in torch::autograd), which releases a long graph without deep recursion.
template <class N, class... A>
NodePtr<N> make_node(A&&... args) {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, N>) {
    return c10::make_intrusive<N>(std::forward<A>(args)...);
  } else {
    return std::shared_ptr<N>(new N(std::forward<A>(args)...), [](N* node) { deleteNode(node); });
  }
}

/// (a written view, the copy the op writes instead): see Note [In-place backward].
using CopiedBack = std::vector<std::pair<at::Tensor, at::Tensor>>;

/// If `v` holds a view that takes part in autograd, puts a copy of it in its place on the stack
/// for the op to write and remembers both in `copied_back`; copy_back() then copies it into the
/// view through autograd (CopySlices of the view's base). Returns the tensor the op will write.
at::Tensor write_a_copy_of_a_view(c10::IValue& v, CopiedBack& copied_back) {
  const at::Tensor t = v.toTensor();
  const auto* meta = ::torch::autograd::impl::get_view_autograd_meta(t);
  if (meta == nullptr || !meta->has_bw_view()) return t;
  copied_back.emplace_back(t, t.clone());
  v = copied_back.back().second;
  return copied_back.back().second;
}

void copy_back(CopiedBack& copied_back) {
  for (auto& [view, copy] : copied_back) view.copy_(copy);
}

// Note [Autograd kernel]
// An op that names a backward op (Note [Backward ops] in opforge/op_builder.h) gets one boxed
// kernel at the Autograd key, of the shape of the kernels torch generates for its own ops
// (VariableType). When grad mode is on and a tensor input requires grad, it saves what the backward
// op asks for (core::BackwardPlan), runs the op below autograd and attaches a BackwardNode to the
// differentiable outputs; otherwise it only redispatches. No Python runs on the call path, unlike
// torch.library.register_autograd (bench/bench_autograd.py compares the two). The node calls the
// backward op through the dispatcher, so its kernels, torch.compile's tracing of the backward graph
// and a backward op's own backward (double backward) work as for any op. Not supported: compiled
// autograd (the node has no compiled_args/apply_with_saved).
//
// An op without a backward op gets no such kernel (registration.cpp): torch's
// autogradNotImplementedFallback where it writes none of its inputs (a backward op without a
// backward of its own included; the fallback works at any torch.func level), writer_autograd below
// where it does (Note [Writers and autograd]). Either way a backward that must pass a gradient
// through it into an input that requires grad raises "derivative for ns::op is not implemented",
// while calls under no_grad or inference_mode, or whose inputs do not require grad, are free.
//
// Note [In-place backward]
// An op with mutated inputs that names a backward op works as torch's in-place ops with a
// derivative formula (VariableType's add_ and friends): check_inplace refuses a write into a
// leaf that requires grad or a view of one; the node's next edges are the inputs' histories
// before the write; the ADInplaceOrView kernel bumps the written tensors' versions; each written
// tensor's history is rebased onto the node (rebase_history), after the op's fresh outputs, in
// argument order (core::result_names), and what the backward op reads of it (`<input>_out`) is
// saved after the write, so a later write into it makes backward refuse with torch's "modified
// by an inplace operation". A written view gets torch's CopySlices node when the op has one
// result and the view is its first tensor argument: CopySlices takes the node's first input
// gradient for the view's slice of the base, as for torch's in-place ops, whose self comes
// first. torch cannot rebase a view onto a node with more results ("Functions which modify
// views in-place must return a single Variable"), yet a Linear's output on 3-d input is a view:
// in every other case a written view that takes part in autograd is computed in a copy that is
// then copied into it (copy_, recorded by autograd), as functionalisation writes views back.
class BackwardNode final : public ::torch::autograd::Node {
 public:
  BackwardNode(const OpforgeOpSpec* op, const core::BackwardPlan* plan, const std::vector<int32_t>* tensor_slot)
      : op_(op), plan_(plan), tensor_slot_(*tensor_slot) {}

  std::string name() const override { return core::qualified_name(*op_) + "Backward"; }

  ::torch::autograd::variable_list apply(::torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);  // against release_variables from another thread
    TORCH_CHECK(!released_ || !saves_anything(), ::torch::autograd::ERR_BACKWARD_TWICE);
    const char* backward_name = core::backward_name(*op_);
    ::torch::jit::Stack stack;
    size_t saved_output = 0;  // saved_outputs_ follows the plan's kOutput sources in order
    for (const auto& [source, i] : plan_->sources) {
      switch (source) {
        case core::BackwardPlan::Source::kGrad:  // zeros for an output that did not reach the loss
          if (absent_[i]) stack.emplace_back();  // an optional written input that was left out: None
          else
            stack.emplace_back(grads[i].defined() ? grads[i] : at::zeros_symint(outputs_[i].first, outputs_[i].second));
          break;
        case core::BackwardPlan::Source::kArg:
          if (op_->args[i].kind != OPFORGE_ARG_TENSOR) stack.push_back(params_[i]);
          else if (saved_args_[i].has_value()) stack.emplace_back(saved_args_[i]->unpack());
          else stack.emplace_back();  // an optional input that was left out
          break;
        case core::BackwardPlan::Source::kOutput:
          if (absent_[i]) {
            stack.emplace_back();
            ++saved_output;
          } else {
            stack.emplace_back(saved_outputs_[saved_output++].unpack(getptr()));
          }
          break;
      }
    }
    backward_->callBoxed(stack);  // under create_graph, its own Autograd kernel records its history
    ::torch::autograd::variable_list input_grads(shapes_.size());
    std::vector<bool> given(shapes_.size(), false);
    for (size_t k = 0; k < plan_->targets.size(); ++k) {
      for (const int32_t i : plan_->targets[k]) {  // one gradient may serve several inputs (grad_a_and_b)
        const int32_t slot = tensor_slot_[i];
        given[slot] = true;
        if (!given_input(slot) || stack[k].isNone()) continue;  // an optional input that was left out gets none
        const at::Tensor& grad = stack[k].toTensor();
        TORCH_CHECK(grad.sym_sizes() == shapes_[slot].first && grad.scalar_type() == shapes_[slot].second,
                    backward_name, " returned ", plan_->output_names[k], " of shape ", grad.sym_sizes(), " and dtype ",
                    grad.scalar_type(), " for ", core::qualified_name(*op_), "'s input ", op_->args[i].name,
                    " of shape ", c10::SymIntArrayRef(shapes_[slot].first), " and dtype ", shapes_[slot].second,
                    "; a gradient has its input's shape and dtype");
        input_grads[slot] = grad;
      }
    }
    for (int32_t i = 0; i < op_->num_args; ++i) {  // as torch's own ops: a needed gradient nobody computes
      const int32_t slot = tensor_slot_[i];
      TORCH_CHECK_NOT_IMPLEMENTED(slot < 0 || given[slot] || !given_input(slot) || !task_should_compute_output(slot),
                                  "the derivative of ", core::qualified_name(*op_), " for its input '",
                                  op_->args[i].name, "' is not implemented: its backward op ", backward_name,
                                  " has no grad_", op_->args[i].name, " output");
    }
    return input_grads;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    for (auto& v : saved_args_)
      if (v) v->reset_data();
    for (auto& v : saved_outputs_) v.reset_data();
  }

  /// Whether tensor argument `slot` was given (not an optional input left out).
  bool given_input(int32_t slot) const { return shapes_[slot].second != at::ScalarType::Undefined; }
  /// Whether the node holds saved tensors, which a second backward would need.
  bool saves_anything() const {
    return !saved_outputs_.empty() ||
           std::any_of(saved_args_.begin(), saved_args_.end(), [](const auto& v) { return v.has_value(); });
  }

  const OpforgeOpSpec* op_;
  const core::BackwardPlan* plan_;
  const std::vector<int32_t>& tensor_slot_;  // per argument: its index among the tensor arguments (the kernel's)
  std::optional<c10::OperatorHandle> backward_;
  bool released_ = false;
  std::vector<std::pair<std::vector<c10::SymInt>, at::ScalarType>> shapes_;  // per tensor argument; Undefined: left out
  std::vector<std::optional<::torch::autograd::SavedVariable>> saved_args_;  // per argument, if saved
  std::vector<c10::IValue> params_;                                          // per argument, if a parameter
  std::vector<::torch::autograd::SavedVariable> saved_outputs_;              // the plan's kOutput sources, in order
  std::vector<std::pair<std::vector<c10::SymInt>, at::TensorOptions>> outputs_;  // per result: zeros for it
  std::vector<bool> absent_;  // per result: an optional written input that was left out
};

class AutogradKernel final : public c10::OperatorKernel {
 public:
  AutogradKernel(const OpforgeOpSpec* op, core::BackwardPlan plan) : op_(op), plan_(std::move(plan)) {
    tensor_slot_.assign(op_->num_args, -1);
    for (int32_t i = 0, t = 0; i < op_->num_args; ++i)
      if (op_->args[i].kind == OPFORGE_ARG_TENSOR) tensor_slot_[i] = t++;
    for (const auto& [source, i] : plan_.sources) {
      if (source == core::BackwardPlan::Source::kArg) save_arg_.push_back(i);
      if (source == core::BackwardPlan::Source::kOutput) save_output_.push_back(i);
    }
    for (int32_t i = 0; i < op_->num_args; ++i)
      if (core::is_mutated(op_->args[i])) written_.push_back(i);
  }

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, ::torch::jit::Stack* stack) {
    const int32_t n = op_->num_args;
    auto arg = [&](int32_t i) -> const c10::IValue& { return (*stack)[stack->size() - n + i]; };
    bool requires_grad = false;
    for (int32_t i = 0; i < n; ++i) {
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR || arg(i).isNone() || !arg(i).toTensor().defined()) continue;
      const at::Tensor& t = arg(i).toTensor();
      requires_grad |= t.requires_grad();
      TORCH_CHECK_NOT_IMPLEMENTED(!t._fw_grad(/*level=*/0).defined(), "Trying to use forward AD with ",
                                  core::qualified_name(*op_),
                                  ", which does not support it: its backward op gives reverse-mode gradients only");
    }
    const bool record = requires_grad && at::GradMode::is_enabled();
    CopiedBack copied_back;
    for (int32_t i : written_) {  // Note [In-place backward]
      c10::IValue& v = (*stack)[stack->size() - n + i];
      if (v.isNone() || !v.toTensor().defined()) continue;  // None: the op's own check names it
      ::torch::autograd::check_inplace(v.toTensor(), record);
      const bool rebase_ok = op_->num_outputs + written_.size() == 1 && tensor_slot_[i] == 0;
      if (record && !rebase_ok) write_a_copy_of_a_view(v, copied_back);
    }
    NodePtr<BackwardNode> node;
    if (record) {
      node = make_node<BackwardNode>(op_, &plan_, &tensor_slot_);
      save_inputs(*node, arg);
    }
    std::vector<at::Tensor> written;
    for (int32_t i : written_) written.push_back(arg(i).isNone() ? at::Tensor() : arg(i).toTensor());
    if (written.empty()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      handle.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    } else {  // through the ADInplaceOrView kernel, which bumps the written tensors' versions
      at::AutoDispatchBelowAutograd guard;
      handle.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
    }
    if (!node) return;
    const int32_t m = op_->num_outputs;
    std::vector<at::Tensor> results;  // core::result_names' order: outputs, then written inputs
    for (int32_t j = 0; j < m; ++j) results.push_back((*stack)[stack->size() - m + j].toTensor());
    for (int32_t j = 0; j < m; ++j) {
      const at::Tensor& out = results[j];
      node->outputs_.emplace_back(out.sym_sizes().vec(), out.options());
      node->absent_.push_back(false);
      // An output whose gradient the backward op does not take gets no history (BackwardPlan::differentiable).
      if (plan_.differentiable[j] && ::torch::autograd::isDifferentiableType(out.scalar_type()))
        ::torch::autograd::set_history(out, node);
      else node->add_input_metadata(::torch::autograd::Node::undefined_input());
    }
    for (const at::Tensor& t : written) {
      results.push_back(t);
      node->outputs_.emplace_back(t.defined() ? t.sym_sizes().vec() : std::vector<c10::SymInt>{},
                                  t.defined() ? t.options() : at::TensorOptions());
      node->absent_.push_back(!t.defined());
      if (t.defined() && ::torch::autograd::isDifferentiableType(t.scalar_type())) {
        const uint32_t nr = node->add_input_metadata(t);
        ::torch::autograd::impl::rebase_history(t, {node, nr});
      } else {
        node->add_input_metadata(::torch::autograd::Node::undefined_input());
      }
    }
    for (int32_t j : save_output_)  // a written view is saved as torch saves `result` of an in-place op on one
      node->saved_outputs_.emplace_back(results[j], /*is_output=*/true,
                                        /*is_inplace_on_view=*/j >= m && results[j].is_view());
    copy_back(copied_back);
  }

 private:
  /// The node's next edges (one per tensor argument, in order), the tensor arguments' shapes
  /// and dtypes, and the arguments the plan saves.
  template <class Arg>
  void save_inputs(BackwardNode& node, const Arg& arg) {
    const int32_t n = op_->num_args;
    std::call_once(found_,
                   [&] { backward_ = c10::Dispatcher::singleton().findSchemaOrThrow(core::backward_name(*op_), ""); });
    node.backward_ = *backward_;
    node.saved_args_.resize(n);
    node.params_.resize(n);
    std::vector<at::Tensor> tensors;  // undefined where an optional one is None
    for (int32_t i = 0; i < n; ++i)
      if (op_->args[i].kind == OPFORGE_ARG_TENSOR)
        tensors.push_back(arg(i).isNone() ? at::Tensor() : arg(i).toTensor());
    node.set_next_edges(::torch::autograd::collect_next_edges(tensors));
    for (const at::Tensor& t : tensors)
      node.shapes_.emplace_back(t.defined() ? t.sym_sizes().vec() : std::vector<c10::SymInt>{},
                                t.defined() ? t.scalar_type() : at::ScalarType::Undefined);
    for (int32_t i : save_arg_) {
      if (op_->args[i].kind != OPFORGE_ARG_TENSOR) node.params_[i] = arg(i);
      else if (!arg(i).isNone()) node.saved_args_[i].emplace(arg(i).toTensor(), /*is_output=*/false);
    }
  }

  const OpforgeOpSpec* op_;
  core::BackwardPlan plan_;
  std::vector<int32_t> tensor_slot_;  // per argument: its index among the tensor arguments, or -1
  std::vector<int32_t> save_arg_, save_output_;
  std::vector<int32_t> written_;  // the mutated arguments, in order
  std::once_flag found_;
  std::optional<c10::OperatorHandle> backward_;
};

// Note [Writers and autograd]
// An overload that writes tensors it is given (`Tensor(a!)` arguments: opforge::mutated inputs,
// out= tensors) has no derivative. Its Autograd kernel does what torch's generated kernels do
// for an in-place op without a formula: check_inplace refuses a write into a leaf that requires
// grad (or a view of one), and when a tensor input requires grad the op's fresh outputs and the
// written tensors get a NotImplemented node, so a backward through them raises "derivative for
// ns::op is not implemented" while forward-only use stays free. It redispatches to the
// ADInplaceOrView kernel, which bumps the version counter of every written tensor, so autograd
// refuses to use a tensor saved before the write. (torch's own boxed fallbacks bump only written
// tensors that are also returned, which an opforge op's mutated inputs are not.) Written views
// are handled as in Note [In-place backward].
void writer_autograd(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, ::torch::jit::Stack* stack) {
  const auto& args = handle.schema().arguments();
  const size_t n = args.size(), start = stack->size() - n;
  const std::string& name = handle.schema().name();
  std::vector<const at::Tensor*> needs_grad;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[start + i];
    if (!v.isTensor() || !v.toTensor().defined()) continue;  // None for a Tensor: the op's own check names it
    const at::Tensor& t = v.toTensor();
    TORCH_CHECK_NOT_IMPLEMENTED(!t._fw_grad(/*level=*/0).defined(), "Trying to use forward AD with ", name,
                                ", which does not support it");
    if (at::GradMode::is_enabled() && t.requires_grad()) needs_grad.push_back(&t);
  }
  const bool any = !needs_grad.empty();
  std::vector<size_t> written_at;  // the written arguments, in order
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[start + i];
    if (v.isTensor() && v.toTensor().defined() && args[i].alias_info() && args[i].alias_info()->isWrite()) {
      ::torch::autograd::check_inplace(v.toTensor(), any);
      written_at.push_back(i);
    }
  }
  NodePtr<::torch::autograd::NotImplemented> node;
  if (any) {
    node = make_node<::torch::autograd::NotImplemented>(name);
    std::vector<at::Tensor> edges;
    for (const at::Tensor* t : needs_grad) edges.push_back(*t);
    node->set_next_edges(::torch::autograd::collect_next_edges(edges));
  }
  // A written view is rebased by torch's CopySlices only onto a node with one input, its first
  // (Note [In-place backward]); otherwise the op writes a copy that is then copied into the view
  // through autograd, so a backward reaches the NotImplemented node and raises as it should. Not
  // for out= overloads, which return the tensor they write.
  const auto& returns = handle.schema().returns();
  const bool out_overload = std::any_of(returns.begin(), returns.end(), [](const c10::Argument& r) {
    return r.alias_info() && r.alias_info()->isWrite();
  });
  const bool copy_views = node && !out_overload && returns.size() + written_at.size() > 1;
  CopiedBack copied_back;
  std::vector<at::Tensor> written;
  for (size_t i : written_at) {
    c10::IValue& v = (*stack)[start + i];
    written.push_back(copy_views ? write_a_copy_of_a_view(v, copied_back) : v.toTensor());
  }
  {
    at::AutoDispatchBelowAutograd guard;
    handle.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
  }
  if (!node) return;
  for (size_t k = 0; k < returns.size(); ++k) {
    const c10::IValue& v = (*stack)[stack->size() - returns.size() + k];
    const bool is_written = returns[k].alias_info() && returns[k].alias_info()->isWrite();  // an out= tensor
    if (v.isTensor() && !is_written && ::torch::autograd::isDifferentiableType(v.toTensor().scalar_type()))
      ::torch::autograd::set_history(v.toTensor(), node);
  }
  for (const at::Tensor& t : written) {  // each at its own input of the node
    if (!::torch::autograd::isDifferentiableType(t.scalar_type())) continue;
    const uint32_t nr = node->add_input_metadata(t);
    ::torch::autograd::impl::rebase_history(t, {node, nr});
  }
  copy_back(copied_back);
}

void writer_inplace(const c10::OperatorHandle& handle, c10::DispatchKeySet keys, ::torch::jit::Stack* stack) {
  const auto& args = handle.schema().arguments();
  const size_t n = args.size(), start = stack->size() - n;
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[start + i];
    if (v.isTensor() && v.toTensor().defined() && args[i].alias_info() && args[i].alias_info()->isWrite())
      written.push_back(v.toTensor());
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    handle.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) ::torch::autograd::increment_version(t);
}

}  // namespace

::torch::CppFunction make_writer_autograd_kernel() {
  return ::torch::CppFunction::makeFromBoxedFunction<&writer_autograd>();
}

::torch::CppFunction make_writer_inplace_kernel() {
  return ::torch::CppFunction::makeFromBoxedFunction<&writer_inplace>();
}

::torch::CppFunction make_autograd_kernel(const OpforgeOpSpec& op, core::BackwardPlan plan) {
  return ::torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(&op, std::move(plan)));
}

}  // namespace opforge::torch
