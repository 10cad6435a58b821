// attention: fused scaled-dot-product attention forward,
//   o = softmax(q k^T * scale + mask [+ causal mask]) v   per batch and head
// (Vaswani et al., "Attention Is All You Need", 2017; the semantics of
// torch.nn.functional.scaled_dot_product_attention with is_causal's top-left alignment).
// The CUDA kernel (kernels/attention.cu) is FlashAttention-2 style: no [Sq, Sk] matrix in memory.
#include <opforge/op.h>

#include <cmath>
#include <limits>
#include <vector>

/// Element offset of row `i` of (batch b, head h) in a [batch, heads, seq, head_dim] input
/// whose last dim is contiguous (opforge::contiguous_last_dim).
static int64_t row_offset(const opforge::Tensor& t, int64_t b, int64_t h, int64_t i) {
  return b * t.stride(0) + h * t.stride(1) + i * t.stride(2);
}

// CPU reference, in double, one (batch, head, query row) at a time. A row whose every score is
// -inf (all keys masked) gives zeros; a NaN score gives a NaN row.
static void attention_cpu(opforge::Tensor q, opforge::Tensor k, opforge::Tensor v, int64_t head_dim,
                          opforge::Tensor mask, bool causal, double scale, opforge::MutableTensor o) {
  opforge::visit_dtype<opforge::half_precision>(q.dtype(), [&]<class T>(opforge::type_tag<T>) {
    const int64_t bh = q.size(0) * q.size(1), heads = q.size(1), sq = q.size(2), sk = k.size(2), d = head_dim;
    const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> p(sk);
    for (int64_t b = 0; b < bh; ++b) {
      const int64_t batch = b / heads, head = b % heads;
      for (int64_t i = 0; i < sq; ++i) {
        const T* qi = q.data<T>() + row_offset(q, batch, head, i);
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        bool nan = false;  // a NaN score makes the row NaN, as in softmax
        for (int64_t j = 0; j < sk; ++j) {
          const T* kj = k.data<T>() + row_offset(k, batch, head, j);
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += double(qi[c]) * double(kj[c]);
          p[j] = dot * s + (mask.defined() ? double(mask.data<T>()[batch * sk + j]) : 0.0);
          if (causal && j > i) p[j] = -std::numeric_limits<double>::infinity();
          mx = std::max(mx, p[j]);
          nan = nan || std::isnan(p[j]);
        }
        if (nan) mx = std::numeric_limits<double>::quiet_NaN();
        for (int64_t j = 0; j < sk; ++j) sum += p[j] = std::isinf(mx) && mx < 0 ? 0.0 : std::exp(p[j] - mx);
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j) acc += p[j] * double(v.data<T>()[row_offset(v, batch, head, j) + c]);
          o.data<T>()[(b * sq + i) * d + c] = T(sum == 0 ? 0.0 : acc / sum);
        }
      }
    }
  });
}

// Grid of kernels/attention.cu: 128 query rows per block, one block row per (head, batch);
// the kernel also gets the batch, head and row strides of q, k and v (declared
// contiguous_last_dim, so a model's head split is read in place).
// Head dim 128 on a compute capability 9.0 device takes the kernel's wgmma path (compiled as
// sm_90a, opforge::kernel_target): 256 threads, 128 keys per step, Q and two stages of K and V in 161 KiB of shared
// memory (attention_sm90::kSharedBytes). Otherwise 128 threads; keys per step 32 (head dim
// 128) or 64, in shared memory with the 128 query rows.
static opforge::LaunchConfig attention_grid(opforge::Tensor q, opforge::Tensor k, opforge::Tensor v, int64_t head_dim,
                                            opforge::Tensor, bool, double, opforge::MutableTensor) {
  OPFORGE_CHECK(q.size(0) <= 65535 && q.size(1) <= 65535,
                "batch and heads must be at most "
                "65535 each (one grid dim each), got ",
                q.size(0), " and ", q.size(1));
  opforge::LaunchConfig c;
  c.grid[0] = static_cast<unsigned>((q.size(2) + 127) / 128);
  c.grid[1] = static_cast<unsigned>(q.size(1));
  c.grid[2] = static_cast<unsigned>(q.size(0));
  if (head_dim == 128 && opforge::kernel_target(q) == "sm_90a") {
    c.block[0] = 256;
    c.shared_bytes = 10 * 128 * 128 + 1024;
  } else {
    c.block[0] = 128;
    c.shared_bytes = static_cast<unsigned>((128 + 2 * (head_dim == 128 ? 32 : 64)) * head_dim * 2);
  }
  c.args = {q.size(1), q.size(2), k.size(2)};
  for (const opforge::Tensor* t : {&q, &k, &v})  // batch, head and row strides (elements) of q, k, v
    for (int d = 0; d < 3; ++d) c.args.push_back(t->stride(d));
  return c;
}

OPFORGE_OP(examples, attention)
    .doc("softmax(q k^T * scale + mask) v over [batch, heads, seq, head_dim]; causal: key j sees query i if j <= i")
    .input("q", opforge::half_precision,
           opforge::shape({opforge::any, opforge::any, opforge::any, opforge::int_param("head_dim")}),
           opforge::contiguous_last_dim)
    .input("k", opforge::same_dtype("q"),
           opforge::shape({opforge::dim("q", 0), opforge::dim("q", 1), opforge::any, opforge::int_param("head_dim")}),
           opforge::contiguous_last_dim)
    .input("v", opforge::same_dtype("q"), opforge::same_shape("k"), opforge::contiguous_last_dim)
    .param<int64_t>("head_dim", opforge::one_of({32, 64, 128}), opforge::compile_time)
    .input("mask", opforge::optional, opforge::same_dtype("q"),
           opforge::shape({opforge::dim("q", 0), opforge::dim("k", 2)}))
    .param<bool>("causal", false, opforge::compile_time)
    .param<double>("scale", 0.0, opforge::at_least(0.0))  // 0: 1 / sqrt(head_dim)
    .output("o", opforge::like("q"))
    .equivalent(
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale or None, attn_mask=(0 if mask is None "
        "else mask[:, None, None, :]) + torch.full((q.shape[2], k.shape[2]), float('-inf'), dtype=q.dtype).triu(1 if "
        "causal else k.shape[2]))")
    .reference(attention_cpu)
    .cuda_source("attention.cu", "attention<{T}, {head_dim}, {causal}>")
    .launch_grid(attention_grid)
    .sharding(opforge::shard_dims({0, 1}));  // batch and heads
