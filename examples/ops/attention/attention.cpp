// attention: fused scaled-dot-product attention forward,
//   o = softmax(q k^T * scale + mask [+ causal mask]) v   per batch and head
// (Vaswani et al., "Attention Is All You Need", 2017; the semantics of
// torch.nn.functional.scaled_dot_product_attention with is_causal's top-left alignment),
// and its backward op attention_backward (grad_q, grad_k, grad_v).
// The CUDA kernels (kernels/attention.cu, compiled at run time, and attention_backward.cu) are
// FlashAttention-2 style: no [Sq, Sk] matrix in memory.
#include <opforge/op.h>

#include <cmath>
#include <limits>
#include <vector>

/// Element offset of row `i` of (batch b, head h) in a [batch, heads, seq, head_dim] input
/// whose last dim is contiguous (opforge::contiguous_last_dim).
static int64_t row_offset(const opforge::Tensor& t, int64_t b, int64_t h, int64_t i) {
  return b * t.stride(0) + h * t.stride(1) + i * t.stride(2);
}

/// The scores of query row `i` of (batch, head) over the keys, in double, into `scores`
/// (k.size(2) entries): q_i k_j * s + mask_j, and -inf for keys after the query (causal).
template <class T>
static void row_scores(const opforge::Tensor& q, const opforge::Tensor& k, const opforge::Tensor& mask, bool causal,
                       double s, int64_t batch, int64_t head, int64_t i, int64_t d, std::vector<double>& scores) {
  const int64_t sk = k.size(2);
  const T* qi = q.data<T>() + row_offset(q, batch, head, i);
  for (int64_t j = 0; j < sk; ++j) {
    const T* kj = k.data<T>() + row_offset(k, batch, head, j);
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += double(qi[c]) * double(kj[c]);
    scores[j] = dot * s + (mask.defined() ? double(mask.data<T>()[batch * sk + j]) : 0.0);
    if (causal && j > i) scores[j] = -std::numeric_limits<double>::infinity();
  }
}

/// log(sum_j exp(scores_j)), taken relative to the row's maximum: -inf when every score is
/// -inf (every key masked), NaN when a score is NaN (softmax's NaN row).
static double log_sum_exp(const std::vector<double>& scores) {
  double mx = -std::numeric_limits<double>::infinity(), sum = 0;
  for (const double x : scores) {
    if (std::isnan(x)) return x;
    mx = std::max(mx, x);
  }
  if (std::isinf(mx) && mx < 0) return mx;
  for (const double x : scores) sum += std::exp(x - mx);
  return mx + std::log(sum);
}

/// The probabilities exp(scores_j - lse) in place: zeros for lse = -inf (no key), NaN for NaN.
static void probabilities(std::vector<double>& scores, double lse) {
  for (double& x : scores) x = std::isinf(lse) && lse < 0 ? 0.0 : std::exp(x - lse);
}

/// The scale of the scores: `scale`, or 1 / sqrt(head_dim) for 0.
static double score_scale(double scale, int64_t head_dim) {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

// CPU reference, in double, one (batch, head, query row) at a time; every floating dtype (the
// CUDA kernel takes 16-bit ones: kernel_dtypes below). lse: each row's log-sum-exp of its scores.
static void attention_cpu(opforge::Tensor q, opforge::Tensor k, opforge::Tensor v, int64_t head_dim,
                          opforge::Tensor mask, bool causal, double scale, opforge::MutableTensor o,
                          opforge::MutableTensor lse) {
  opforge::visit_dtype<opforge::floating>(q.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t bh = q.size(0) * q.size(1), heads = q.size(1), sq = q.size(2), sk = k.size(2), d = head_dim;
    std::vector<double> p(sk);
    for (int64_t b = 0; b < bh; ++b) {
      const int64_t batch = b / heads, head = b % heads;
      for (int64_t i = 0; i < sq; ++i) {
        row_scores<T>(q, k, mask, causal, score_scale(scale, d), batch, head, i, d, p);
        const double row_lse = log_sum_exp(p);
        lse.data<float>()[b * sq + i] = static_cast<float>(row_lse);
        probabilities(p, row_lse);
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j) acc += p[j] * double(v.data<T>()[row_offset(v, batch, head, j) + c]);
          o.data<T>()[(b * sq + i) * d + c] = T(acc);
        }
      }
    }
  });
}

// Grid of kernels/attention.cu: one block per `rows` query rows, one block row per (head, batch);
// the kernel also gets the batch, head and row strides of q, k and v (declared
// contiguous_last_dim, so a model's head split is read in place) and three tensor maps.
// Head dims 64 and 128 on a compute capability 9.0 device take the kernel's Hopper path
// (compiled as sm_90a, opforge::kernel_target): a producer warpgroup and 64-row consumer
// warpgroups (attention_detail::kConsumers: three at head dim 64, so 192 rows and 512 threads;
// two at 128, so 128 rows and 384 threads), Q and two stages of 128 keys and values in shared
// memory (attention_sm90::Smem: 161 KiB at head dim 128, 89 at 64), copied by the copy engine
// through the tensor maps of q, k and v (boxes of 64 columns by 128 rows, q's by `rows`, 128-byte
// swizzle). Otherwise 128 rows and threads; keys per step 32 (head dim 128) or 64, in shared
// memory with the query rows, and the maps are left empty.
static opforge::LaunchConfig attention_grid(opforge::Tensor q, opforge::Tensor k, opforge::Tensor v, int64_t head_dim,
                                            opforge::Tensor, bool, double, opforge::MutableTensor,
                                            opforge::MutableTensor) {
  OPFORGE_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535,
                "batch and heads must be at most "
                "65535 each (one grid dim each), got ",
                q.size(0), " and ", q.size(1));
  opforge::LaunchConfig c;
  c.tensor_maps.resize(3);
  unsigned rows = 128;
  if (head_dim >= 64 && opforge::kernel_target(q) == "sm_90a") {
    const unsigned consumers = head_dim == 64 ? 3 : 2, halves = static_cast<unsigned>(head_dim / 64);
    constexpr unsigned kHalf = 128 * 128, kStages = 2;  // attention_sm90::Smem<head_dim>::kBytes
    rows = 64 * consumers;
    c.block[0] = 128 * (1 + consumers);
    c.shared_bytes = halves * (rows * 128 + 2 * kStages * kHalf) + (1 + 4 * kStages) * 8 + 1024;
    const opforge::Tensor* qkv[] = {&q, &k, &v};
    for (int i = 0; i < 3; ++i)
      if (qkv[i]->numel() > 0)  // an empty tensor has no map (and no copy reads it)
        c.tensor_maps[i] =
            opforge::tensor_map(*qkv[i], {64, i == 0 ? rows : 128u, 1, 1}, opforge::TensorMapSwizzle::k128B);
  } else {
    c.block[0] = 128;
    c.shared_bytes = static_cast<unsigned>((128 + 2 * (head_dim == 128 ? 32 : 64)) * head_dim * 2);
  }
  c.grid[0] = static_cast<unsigned>((q.size(2) + rows - 1) / rows);
  c.grid[1] = static_cast<unsigned>(q.size(1));
  c.grid[2] = static_cast<unsigned>(q.size(0));
  c.args = {q.size(1), q.size(2), k.size(2)};
  for (const opforge::Tensor* t : {&q, &k, &v})  // batch, head and row strides (elements) of q, k, v
    for (int d = 0; d < 3; ++d) c.args.push_back(t->stride(d));
  return c;
}

// The shapes both ops ask of q (grad_o and o follow it), k (v follows it) and the mask.
const auto q_shape = opforge::shape({opforge::any, opforge::any, opforge::any, opforge::int_param("head_dim")});
const auto k_shape =
    opforge::shape({opforge::dim("q", 0), opforge::dim("q", 1), opforge::any, opforge::int_param("head_dim")});
const auto mask_shape = opforge::shape({opforge::dim("q", 0), opforge::dim("k", 2)});
const auto lse_shape = opforge::shape({opforge::dim("q", 0), opforge::dim("q", 1), opforge::dim("q", 2)});

OPFORGE_OP(examples, attention)
    .doc("softmax(q k^T * scale + mask) v over [batch, heads, seq, head_dim]; causal: key j sees query i if j <= i")
    .input("q", opforge::floating, q_shape, opforge::contiguous_last_dim)
    .input("k", opforge::same_dtype("q"), k_shape, opforge::contiguous_last_dim)
    .input("v", opforge::same_dtype("q"), opforge::same_shape("k"), opforge::contiguous_last_dim)
    .param<int64_t>("head_dim", opforge::one_of({32, 64, 128}), opforge::compile_time)
    .input("mask", opforge::optional, opforge::same_dtype("q"), mask_shape)
    .param<bool>("causal", false, opforge::compile_time)
    .param<double>("scale", 0.0, opforge::at_least(0.0))  // 0: 1 / sqrt(head_dim)
    .output("o", opforge::like("q"))
    // Each query row's log-sum-exp of its scores (natural log; -inf where every key is masked), as
    // the logsumexp of torch's _scaled_dot_product_flash_attention: what the backward op needs
    // of the forward's softmax. Not differentiable (attention_backward takes no grad_lse).
    .output("lse", lse_shape, opforge::kFloat32)
    .equivalent(
        "(lambda m: (torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale or None, attn_mask=m), "
        "torch.logsumexp(q @ k.mT * (scale or head_dim ** -0.5) + m, -1).float()))((0 if mask is None else mask[:, "
        "None, None, :]) + q.new_full((q.shape[2], k.shape[2]), -torch.inf).triu(1 if causal else k.shape[2]))")
    .reference(attention_cpu)
    .cuda_source("attention.cu", "attention<{T}, {head_dim}, {causal}>")
    .launch_grid(attention_grid)
    .kernel_dtypes("q", opforge::half_precision)  // tensor-core MMAs on 16-bit inputs
    .backward("attention_backward")
    .sharding(opforge::shard_dims({0, 1}));  // batch and heads

// CPU reference of the gradients, in double, per (batch, head) and query row i, with
// p_j = exp(s_j - lse_i) the row's probabilities from its scores s (row_scores) and the
// forward's log-sum-exp lse_i, g = grad_o[i] and o_i the forward's output row:
//   dp_j = g . v_j,  ds_j = p_j (dp_j - g . o_i),
//   grad_q[i] = scale * sum_j ds_j k_j,  grad_k[j] += scale * ds_j q_i,  grad_v[j] += p_j g
// (the softmax Jacobian diag(p) - p p^T applied to dp, with sum_j p_j dp_j = g . o_i:
// FlashAttention-2's backward, Dao 2023, Algorithm 2, which the CUDA kernels compute blockwise;
// `o` and `lse` must be the forward's outputs for these to be attention's gradients).
static void attention_backward_cpu(opforge::Tensor q, opforge::Tensor k, opforge::Tensor v, opforge::Tensor grad_o,
                                   opforge::Tensor o, opforge::Tensor lse, int64_t head_dim, opforge::Tensor mask,
                                   bool causal, double scale, opforge::MutableTensor grad_q,
                                   opforge::MutableTensor grad_k, opforge::MutableTensor grad_v) {
  opforge::visit_dtype<opforge::floating>(q.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t heads = q.size(1), sq = q.size(2), sk = k.size(2), d = head_dim;
    const double s = score_scale(scale, d);
    std::vector<double> p(sk), ds(sk), gk(sk * d), gv(sk * d), gq(d);
    for (int64_t b = 0; b < q.size(0) * heads; ++b) {
      const int64_t batch = b / heads, head = b % heads;
      std::fill(gk.begin(), gk.end(), 0.0);
      std::fill(gv.begin(), gv.end(), 0.0);
      for (int64_t i = 0; i < sq; ++i) {
        row_scores<T>(q, k, mask, causal, s, batch, head, i, d, p);
        probabilities(p, lse.data<float>()[b * sq + i]);
        const T* g = grad_o.data<T>() + row_offset(grad_o, batch, head, i);
        const T* qi = q.data<T>() + row_offset(q, batch, head, i);
        const T* oi = o.data<T>() + row_offset(o, batch, head, i);
        double dot = 0;  // g . o_i
        for (int64_t c = 0; c < d; ++c) dot += double(g[c]) * double(oi[c]);
        for (int64_t j = 0; j < sk; ++j) {
          const T* vj = v.data<T>() + row_offset(v, batch, head, j);
          double dp = 0;
          for (int64_t c = 0; c < d; ++c) dp += double(g[c]) * double(vj[c]);
          ds[j] = dp;
        }
        std::fill(gq.begin(), gq.end(), 0.0);
        for (int64_t j = 0; j < sk; ++j) {
          ds[j] = p[j] * (ds[j] - dot);
          const T* kj = k.data<T>() + row_offset(k, batch, head, j);
          for (int64_t c = 0; c < d; ++c) {
            gq[c] += s * ds[j] * double(kj[c]);
            gk[j * d + c] += s * ds[j] * double(qi[c]);
            gv[j * d + c] += p[j] * double(g[c]);
          }
        }
        for (int64_t c = 0; c < d; ++c) grad_q.data<T>()[(b * sq + i) * d + c] = T(gq[c]);
      }
      for (int64_t e = 0; e < sk * d; ++e) {
        grad_k.data<T>()[b * sk * d + e] = T(gk[e]);
        grad_v.data<T>()[b * sk * d + e] = T(gv[e]);
      }
    }
  });
}

// attention_backward.cu
void attention_backward_cuda(const opforge::Context& ctx, opforge::Tensor q, opforge::Tensor k, opforge::Tensor v,
                             opforge::Tensor grad_o, opforge::Tensor o, opforge::Tensor lse, int64_t head_dim,
                             opforge::Tensor mask, bool causal, double scale, opforge::MutableTensor grad_q,
                             opforge::MutableTensor grad_k, opforge::MutableTensor grad_v);

// The gradients of attention (Note [Backward ops] in opforge/op_builder.h): grad_o, and q, k, v, o, lse,
// mask and the parameters saved from the forward call (o, lse: the forward's outputs for them). A
// mask that requires grad gets none (an additive padding mask is data, not a parameter): its
// backward raises, naming the op.
OPFORGE_OP(examples, attention_backward)
    .doc("attention's gradients grad_q, grad_k, grad_v; the score matrix is recomputed blockwise, never stored")
    .input("q", opforge::floating, q_shape, opforge::contiguous_last_dim)
    .input("k", opforge::same_dtype("q"), k_shape, opforge::contiguous_last_dim)
    .input("v", opforge::same_dtype("q"), opforge::same_shape("k"), opforge::contiguous_last_dim)
    .input("grad_o", opforge::same_dtype("q"), opforge::same_shape("q"), opforge::contiguous_last_dim)
    .input("o", opforge::same_dtype("q"), opforge::same_shape("q"), opforge::contiguous_last_dim)
    .input("lse", opforge::kFloat32, lse_shape)
    .param<int64_t>("head_dim", opforge::one_of({32, 64, 128}))
    .input("mask", opforge::optional, opforge::same_dtype("q"), mask_shape)
    .param<bool>("causal", false)
    .param<double>("scale", 0.0, opforge::at_least(0.0))
    .output("grad_q", opforge::like("q"))
    .output("grad_k", opforge::like("k"))
    .output("grad_v", opforge::like("v"))
    .equivalent(  // with the forward's lse and o, as the reference and kernels take them; in q's dtype
        "(lambda s: (lambda p: (lambda d: (s * d @ k, s * d.mT @ q, p.mT @ grad_o))(p * (grad_o @ v.mT - (grad_o * o)"
        ".sum(-1, True))))(torch.where(lse[..., None] == -torch.inf, 0.0, (q @ k.mT * s + (0 if mask is None else "
        "mask[:, None, None]) + q.new_full((q.shape[2], k.shape[2]), -torch.inf).triu(1 if causal else k.shape[2]) - "
        "lse[..., None]).exp()).to(q.dtype)))(scale or head_dim ** -0.5)")
    .reference(attention_backward_cpu)
    .cuda(attention_backward_cuda)
    .kernel_dtypes("q", opforge::half_precision)
    // The kernels round P and dS to the input dtype before their products (FlashAttention-2),
    // and a gradient's sum over keys or queries can cancel far below that rounding (a large
    // scale): where verify's defaults are missed, FlashAttention's own criterion.
    .tolerance_vs_equivalent(2.0)
    .sharding(opforge::shard_dims({0, 1}));
