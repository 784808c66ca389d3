// The check the kernels make of a variable before they read it as floats.
//
// Each op checks its inputs' shapes and dtypes and its attributes before
// it reads or writes a variable, returning InvalidArgumentError: TensorFlow
// would abort the process on a tensor read as another shape or dtype.

#ifndef TFEMB_KERNELS_INPUT_CHECKS_H_
#define TFEMB_KERNELS_INPUT_CHECKS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tfemb {

// OK if `var` holds an initialized float32 matrix. Checked before anything
// reads it as float (EnsureSparseVariableAccess<float> included, whose copy
// of a buffer of another dtype would abort the process).
// `what` names the variable in the error. Static, not inline: the build's
// one translation unit (build.py) has one copy, which each kernel calls
// once per op, out of its own code.
static absl::Status CheckFloatMatrix(::tensorflow::Var* var,
                                     const std::string& what) {
  ::tensorflow::tf_shared_lock lock(*var->mu());
  const ::tensorflow::Tensor& t = *var->tensor();
  if (!t.IsInitialized() || t.dtype() != ::tensorflow::DT_FLOAT ||
      t.dims() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be an initialized float32 matrix; got ",
        ::tensorflow::DataTypeString(t.dtype()), " ",
        t.shape().DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace tfemb

#endif  // TFEMB_KERNELS_INPUT_CHECKS_H_
