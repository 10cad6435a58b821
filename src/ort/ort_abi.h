// The part of ONNX Runtime's C ABI the ONNX Runtime adapter uses, declared by opforge.
//
// Note [ONNX Runtime's C ABI]
// ---------------------------
// ONNX Runtime publishes its C API as one table of function pointers (OrtApi) that a library
// gets from OrtGetApiBase()->GetApi(version), and takes custom ops as a struct of callbacks
// (OrtCustomOp). Both are append-only: a function keeps its position in the table from the
// release that added it on, a struct field its offset, so a table position and a field offset
// are the whole contract. The pip wheel ships no headers, so this file declares, in opforge's
// own words, only what the adapter calls: each function by its position in the table
// (ort::Slot, with the API version that added it), its signature where it is called, the
// callbacks of OrtCustomOp up to version kCustomOpVersion, and the enums' values (ONNX's
// TensorProto numbering for element types). The positions were checked against the table's
// own checkpoints (the last function of each version): ReleaseCustomOpDomain 101,
// GetCurrentGpuDeviceId 161, SynchronizeBoundOutputs 203, GetSessionConfigEntry 238,
// GetBuildInfoString 254, KernelContext_GetResource 265, SetUserLoggingFunction 266.
//
// A function added later is declared here with its slot and the version that added it; the
// adapter asks GetApi for kApiVersion, so an older runtime refuses the library by name instead
// of calling past the end of its table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace opforge::ort {

/// The OrtApi version the adapter asks for: the newest function it calls (the shape-inference
/// context, ReadOpAttr) came with 17, ONNX Runtime 1.17.
constexpr uint32_t kApiVersion = 17;
/// OrtCustomOp::version the adapter's ops declare: their structs hold the callbacks up to
/// GetEndVersion (17), and ONNX Runtime reads no field past those of this version.
constexpr uint32_t kCustomOpVersion = 17;

// Opaque handles: ONNX Runtime's objects, only ever held by pointer.
struct Status;
struct SessionOptions;
struct CustomOpDomain;
struct KernelInfo;
struct KernelContext;
struct Value;
struct TensorTypeAndShapeInfo;
struct MemoryInfo;
struct ShapeInferContext;
struct OpAttr;
struct Env;
struct Session;
struct RunOptions;
struct TypeInfo;

/// ONNX Runtime's allocator: a struct of callbacks (version, Alloc, Free, Info).
struct Allocator {
  uint32_t version;
  void* (*Alloc)(Allocator* self, size_t size);
  void (*Free)(Allocator* self, void* p);
  const MemoryInfo* (*Info)(const Allocator* self);
};

/// ONNX's element types (TensorProto.DataType), which ONNX Runtime uses as they are.
enum ElementType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
};

/// OrtErrorCode values the adapter returns.
enum ErrorCode : int32_t { kOk = 0, kFail = 1, kInvalidArgument = 2 };

/// OrtCustomOpInputOutputCharacteristic.
enum Characteristic : int32_t { kRequired = 0, kOptional = 1, kVariadic = 2 };

/// OrtMemType: kMemDefault is the execution provider's own memory.
enum MemType : int32_t { kMemCpuInput = -2, kMemCpuOutput = -1, kMemDefault = 0 };

/// OrtAllocatorType.
enum AllocatorType : int32_t { kDeviceAllocator = 0, kArenaAllocator = 1 };

/// OrtOpAttrType (ReadOpAttr).
enum AttrType : int32_t {
  kAttrUndefined = 0,
  kAttrInt = 1,
  kAttrInts = 2,
  kAttrFloat = 3,
  kAttrFloats = 4,
  kAttrString = 5
};

/// OrtLoggingLevel.
enum LoggingLevel : int32_t { kLogVerbose = 0, kLogInfo = 1, kLogWarning = 2, kLogError = 3, kLogFatal = 4 };

/// Positions in the OrtApi table of the functions opforge calls (the comment: the API version
/// that added each).
enum class Slot : int32_t {
  CreateStatus = 0,                                     // 1
  GetErrorCode = 1,                                     // 1
  GetErrorMessage = 2,                                  // 1
  CreateEnv = 3,                                        // 1
  CreateSession = 7,                                    // 1
  Run = 9,                                              // 1
  CreateSessionOptions = 10,                            // 1
  CreateCustomOpDomain = 26,                            // 1
  CustomOpDomain_Add = 27,                              // 1
  AddCustomOpDomain = 28,                               // 1
  SessionGetInputCount = 30,                            // 1
  SessionGetOutputCount = 31,                           // 1
  SessionGetInputTypeInfo = 33,                         // 1
  SessionGetInputName = 36,                             // 1
  SessionGetOutputName = 37,                            // 1
  CreateTensorWithDataAsOrtValue = 49,                  // 1
  GetTensorMutableData = 51,                            // 1
  CastTypeInfoToTensorInfo = 55,                        // 1
  CreateTensorTypeAndShapeInfo = 57,                    // 1
  SetTensorElementType = 58,                            // 1
  SetDimensions = 59,                                   // 1
  GetTensorElementType = 60,                            // 1
  GetDimensionsCount = 61,                              // 1
  GetDimensions = 62,                                   // 1
  GetSymbolicDimensions = 63,                           // 1
  GetTensorTypeAndShape = 65,                           // 1
  CreateMemoryInfo = 68,                                // 1
  CreateCpuMemoryInfo = 69,                             // 1
  MemoryInfoGetId = 72,                                 // 1
  AllocatorAlloc = 75,                                  // 1
  AllocatorFree = 76,                                   // 1
  GetAllocatorWithDefaultOptions = 78,                  // 1
  KernelInfoGetAttribute_float = 85,                    // 1
  KernelInfoGetAttribute_int64 = 86,                    // 1
  KernelInfoGetAttribute_string = 87,                   // 1
  KernelContext_GetInputCount = 88,                     // 1
  KernelContext_GetOutputCount = 89,                    // 1
  KernelContext_GetInput = 90,                          // 1
  KernelContext_GetOutput = 91,                         // 1
  ReleaseEnv = 92,                                      // 1
  ReleaseStatus = 93,                                   // 1
  ReleaseMemoryInfo = 94,                               // 1
  ReleaseSession = 95,                                  // 1
  ReleaseValue = 96,                                    // 1
  ReleaseTypeInfo = 98,                                 // 1
  ReleaseTensorTypeAndShapeInfo = 99,                   // 1
  ReleaseSessionOptions = 100,                          // 1
  AddSessionConfigEntry = 130,                          // 5
  ReleaseAllocator = 132,                               // 5
  KernelInfoGetAttributeArray_float = 162,              // 8
  KernelInfoGetAttributeArray_int64 = 163,              // 8
  KernelContext_GetGPUComputeStream = 193,              // 10
  GetTensorMemoryInfo = 194,                            // 10
  SessionOptionsAppendExecutionProvider_CUDA_V2 = 204,  // 11
  CreateCUDAProviderOptions = 205,                      // 11
  ReleaseCUDAProviderOptions = 208,                     // 11
  RegisterCustomOpsLibrary_V2 = 228,                    // 14
  KernelInfo_GetInputCount = 230,                       // 14
  KernelInfo_GetOutputCount = 231,                      // 14
  GetSessionConfigEntry = 238,                          // 14
  KernelContext_GetAllocator = 253,                     // 15
  ShapeInferContext_GetInputCount = 267,                // 17
  ShapeInferContext_GetInputTypeShape = 268,            // 17
  ShapeInferContext_GetAttribute = 269,                 // 17
  ShapeInferContext_SetOutputTypeShape = 270,           // 17
  SetSymbolicDimensions = 271,                          // 17
  ReadOpAttr = 272,                                     // 17
};

/// The OrtApi table as ONNX Runtime hands it out.
struct Api {
  const void* const* table;

  /// The function at `slot`, as the function pointer type `Fn` (its signature where it is called).
  template <class Fn>
  Fn get(Slot slot) const {
    return reinterpret_cast<Fn>(const_cast<void*>(table[static_cast<int32_t>(slot)]));
  }
  /// Calls the function at `slot` with `args`: `api.call<Status*>(Slot::X, a, b)`.
  template <class R, class... Args>
  R call(Slot slot, Args... args) const {
    return get<R (*)(Args...)>(slot)(args...);
  }
};

/// OrtApiBase: the two functions OrtGetApiBase() returns.
struct ApiBase {
  const void* const* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

/// OrtCustomOp up to version kCustomOpVersion: the callbacks through which ONNX Runtime builds
/// an op's schema and kernel and runs it.
struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const CustomOp* op, const void* const* api, const KernelInfo* info);
  const char* (*GetName)(const CustomOp* op);
  const char* (*GetExecutionProviderType)(const CustomOp* op);
  ElementType (*GetInputType)(const CustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const CustomOp* op);
  ElementType (*GetOutputType)(const CustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const CustomOp* op);
  void (*KernelCompute)(void* kernel, KernelContext* context);
  void (*KernelDestroy)(void* kernel);
  Characteristic (*GetInputCharacteristic)(const CustomOp* op, size_t index);
  Characteristic (*GetOutputCharacteristic)(const CustomOp* op, size_t index);
  MemType (*GetInputMemoryType)(const CustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const CustomOp* op);
  int (*GetVariadicInputHomogeneity)(const CustomOp* op);
  int (*GetVariadicOutputMinArity)(const CustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const CustomOp* op);
  Status* (*CreateKernelV2)(const CustomOp* op, const void* const* api, const KernelInfo* info, void** kernel);
  Status* (*KernelComputeV2)(void* kernel, KernelContext* context);
  Status* (*InferOutputShapeFn)(const CustomOp* op, ShapeInferContext* context);
  int (*GetStartVersion)(const CustomOp* op);
  int (*GetEndVersion)(const CustomOp* op);
};

}  // namespace opforge::ort
