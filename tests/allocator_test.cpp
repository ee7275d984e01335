// Tests of swapnet/allocator.h: the CUDA probe answers, never fails, and explains itself.
#include <gtest/gtest.h>

#include "swapnet/allocator.h"

namespace swapnet {
namespace {

TEST(CudaDevice, ProbeIsConsistent) {
  const DeviceInfo& d = cuda_device();
  EXPECT_EQ(&d, &cuda_device()) << "probed once";
  if (d.usable) {
    EXPECT_TRUE(d.built_with_cuda);
    EXPECT_GE(d.count, 1);
    EXPECT_FALSE(d.name.empty());
  } else {
    EXPECT_FALSE(d.reason.empty()) << "a missing GPU must say why";
    EXPECT_TRUE(d.name.empty());
  }
}

}  // namespace
}  // namespace swapnet
