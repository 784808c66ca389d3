// Tables and slots backed by 2 MiB pages (huge_pages.cc).

#ifndef TFEMB_KERNELS_HUGE_PAGES_H_
#define TFEMB_KERNELS_HUGE_PAGES_H_

#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfemb {

// MADV_HUGEPAGE and MADV_COLLAPSE on the 2 MiB-aligned interior of `t`, a
// buffer of `var` of 4 MiB or more, the first time a kernel sees that
// variable and buffer; nothing the times after. Best effort: a refusal
// changes nothing but speed.
void BackWithHugePages(const ::tensorflow::Var* var,
                       const ::tensorflow::Tensor& t);

}  // namespace tfemb

#endif  // TFEMB_KERNELS_HUGE_PAGES_H_
