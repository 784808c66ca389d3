// What every kernel file takes from TensorFlow: its op and kernel
// framework, and the names the kernels use, declared once.

#ifndef TFEMB_KERNELS_TF_KERNEL_H_
#define TFEMB_KERNELS_TF_KERNEL_H_

// Eigen's ThreadPoolDevice (`CPUDevice`), as TensorFlow's CPU kernels use.
#ifndef EIGEN_USE_THREADS
#define EIGEN_USE_THREADS
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tfemb {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::TensorShapeUtils;
using ::tensorflow::Var;
using ::tensorflow::core::RefCountPtr;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
using CPUDevice = Eigen::ThreadPoolDevice;

}  // namespace tfemb

#endif  // TFEMB_KERNELS_TF_KERNEL_H_
