// Saving an interleaved table without a second copy of it: see
// column_split.cc.

#ifndef TFEMB_KERNELS_COLUMN_SPLIT_H_
#define TFEMB_KERNELS_COLUMN_SPLIT_H_

#include "tensorflow/core/framework/resource_var.h"

namespace tfemb {

// Puts the rows of `var`'s table back if a save has split it and its
// tensors are still alive (otherwise nothing, at the cost of one atomic
// load). Every kernel calls it before it reads or writes a table's buffer,
// holding the variable's lock (shared or exclusive).
void RejoinColumns(::tensorflow::Var* var);

}  // namespace tfemb

#endif  // TFEMB_KERNELS_COLUMN_SPLIT_H_
