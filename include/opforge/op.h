// opforge/op.h -- describe an operator once; every framework adapter derives the rest.
//
// The one header an op file includes. It pulls in no framework and no CUDA header.
//
//   #include <opforge/op.h>
//
//   void softshrink_cpu(opforge::Tensor x, double lambd, opforge::MutableTensor y);
//   void softshrink_cuda(const opforge::Context& ctx, opforge::Tensor x, double lambd,
//                        opforge::MutableTensor y);  // in softshrink.cu
//
//   OPFORGE_OP(examples, softshrink)
//       .doc("x - lambd where x > lambd, x + lambd where x < -lambd, else 0")
//       .input("x", opforge::floating)
//       .param<double>("lambd", 0.5, opforge::at_least(0.0))
//       .output("y", opforge::like("x"))
//       .reference(softshrink_cpu)
//       .cuda(softshrink_cuda);
//
// Loaded through the torch adapter this becomes `torch.ops.examples.softshrink(Tensor x,
// float lambd=0.5) -> Tensor` with CPU, CUDA and Meta kernels, checked inputs, and support for
// torch.compile, torch.export and AOTInductor.
//
// This header gathers the description API, one subject a header, each with its Notes:
//
//   opforge/op_builder.h      OPFORGE_OP and its builder: argument order, kernel signatures,
//                             backward ops, autocast, sharding. Note [Kernel dtypes],
//                             Note [Backward ops]
//   opforge/op_constraints.h  what an input or a parameter accepts. Note [Mutated inputs],
//                             Note [Value domains]
//   opforge/op_launch.h       launch rules of run-time kernels. Note [Run-time kernels]
//   opforge/op_cuda.h         what a grid function asks of CUDA: tensor maps, the compile target
//   opforge/op_class.h        OPFORGE_CLASS, state kept between calls. Note [Custom classes]
//   opforge/expr.h            shape expressions. Note [Shape expressions],
//                             Note [Data-dependent sizes]
//   opforge/tensor.h, dtype.h, error.h   what kernels see: tensors, the context, dtypes, errors
#pragma once

#include "opforge/dtype.h"
#include "opforge/error.h"
#include "opforge/expr.h"
#include "opforge/op_builder.h"
#include "opforge/op_class.h"
#include "opforge/op_constraints.h"
#include "opforge/op_cuda.h"
#include "opforge/op_launch.h"
#include "opforge/tensor.h"
