// identity_conv: y = x, a stateless op whose CPU kernel is a copy and whose CUDA kernel
// honours the input's shape, dtype and strides. The input is declared strided, so permuted,
// sliced, expanded and storage-offset views arrive as they are; y is dense and row-major.
//
// IdentityConvClass: the same copy as the method of a custom class whose one field is its
// `channels` (Note [Custom classes] in opforge/op_class.h): `forward(x)` takes x of [N, channels, ...].
#include <opforge/op.h>

#include <cstring>
#include <vector>

// CPU reference: walks y in row-major order and copies each element's bytes from x's offset
// (sum of index * stride over the dims), so every dtype copies bit for bit.
static void identity_conv_cpu(opforge::Tensor x, opforge::MutableTensor y) {
  const size_t bytes = opforge::dtype_size(x.dtype());
  const char* in = static_cast<const char*>(x.raw_data());
  char* out = static_cast<char*>(y.raw_data());
  std::vector<int64_t> index(x.ndim(), 0);
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    int64_t offset = 0;
    for (int32_t d = 0; d < x.ndim(); ++d) offset += index[d] * x.stride(d);
    std::memcpy(out + i * bytes, in + offset * bytes, bytes);
    for (int32_t d = x.ndim() - 1; d >= 0 && ++index[d] == x.size(d); --d) index[d] = 0;
  }
}

// identity_conv.cu
void identity_conv_cuda(const opforge::Context& ctx, opforge::Tensor x, opforge::MutableTensor y);

OPFORGE_OP(examples, identity_conv)
    .doc("y = x as a dense row-major copy, for any dtype, rank (0 to 16) and layout")
    .input("x", opforge::floating | opforge::integral | opforge::kBool, opforge::strided, opforge::rank_between(0, 16))
    .output("y", opforge::like("x"))
    .equivalent("x.clone()")
    .sharding(opforge::Sharding::kPointwise)
    .reference(identity_conv_cpu)
    .cuda(identity_conv_cuda);

static void identity_conv_forward_cpu(opforge::Tensor x, int64_t, opforge::MutableTensor y) { identity_conv_cpu(x, y); }

static void identity_conv_forward_cuda(const opforge::Context& ctx, opforge::Tensor x, int64_t,
                                       opforge::MutableTensor y) {
  identity_conv_cuda(ctx, x, y);
}

OPFORGE_OP(examples, identity_conv_forward)
    .doc("IdentityConvClass.forward: y = x for x of [N, channels, ...], as a dense row-major copy")
    .input("x", opforge::floating | opforge::integral | opforge::kBool, opforge::strided, opforge::rank_between(2, 16))
    .param<int64_t>("channels", opforge::at_least(1))
    .output("y", opforge::like("x"))
    .require(opforge::dim("x", 1) == opforge::int_param("channels"))
    .equivalent("x.clone()")
    .reference(identity_conv_forward_cpu)
    .cuda(identity_conv_forward_cuda);

OPFORGE_CLASS(examples, IdentityConvClass)
    .doc("An identity convolution over `channels` channels: forward(x) returns a copy of x")
    .field<int64_t>("channels")
    .method("forward", "identity_conv_forward");
