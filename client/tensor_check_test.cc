#include "client/tensor_check.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

std::vector<Tensor> Good() {
  static float a[6], b[1];
  std::vector<Tensor> t(3);
  t[0] = {"w", DType::kFloat32, {2, 3}, a, Device::Host()};
  t[1] = {"scalar", DType::kFloat32, {}, b, Device::Host()};
  t[2] = {"empty", DType::kInt64, {0, 4}, nullptr, Device::Host()};
  return t;
}

void ExpectRefused(const std::vector<Tensor>& t, absl::StatusCode code,
                   const std::string& text) {
  std::vector<uint64_t> bytes;
  absl::Status s = ValidateTensors(t, &bytes);
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(text), std::string::npos) << s;
}

TEST(TensorCheckTest, ValidTensorsGetTheirByteSizes) {
  std::vector<uint64_t> bytes;
  ASSERT_TRUE(ValidateTensors(Good(), &bytes).ok());
  EXPECT_EQ(bytes, (std::vector<uint64_t>{24, 4, 0}));
}

TEST(TensorCheckTest, ErrorsNameTheTensor) {
  auto t = Good();
  t[2].name = "w";
  ExpectRefused(t, absl::StatusCode::kInvalidArgument,
                "tensors[2] (\"w\"): duplicate");
  t = Good();
  t[1].name = "";
  ExpectRefused(t, absl::StatusCode::kInvalidArgument, "tensors[1].name");
  t = Good();
  t[0].dtype = static_cast<DType>(99);
  ExpectRefused(t, absl::StatusCode::kInvalidArgument,
                "tensors[0] (\"w\").dtype");
  t = Good();
  t[0].shape = {-1, 3};
  ExpectRefused(t, absl::StatusCode::kInvalidArgument,
                "tensors[0] (\"w\").shape");
  t = Good();
  t[0].shape = std::vector<int64_t>(9, 1);
  ExpectRefused(t, absl::StatusCode::kInvalidArgument, "9 dimensions");
  t = Good();
  t[0].data = nullptr;
  ExpectRefused(t, absl::StatusCode::kInvalidArgument,
                "tensors[0] (\"w\").data");
  t = Good();
  t[0].device = Device::Cuda(-2);
  ExpectRefused(t, absl::StatusCode::kInvalidArgument,
                "tensors[0] (\"w\").device");
  ExpectRefused({}, absl::StatusCode::kInvalidArgument, "tensors: empty");
}

TEST(TensorCheckTest, CudaTensorsNeedACudaBuild) {
  auto t = Good();
  t[0].device = Device::Cuda(0);
  std::vector<uint64_t> bytes;
  absl::Status s = ValidateTensors(t, &bytes);
  if (BuiltWithCuda()) {
    EXPECT_TRUE(s.ok()) << s;
    return;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("cuda:0"), std::string::npos) << s;
}

TEST(TensorCheckTest, ADeviceTensorWithoutADeviceIsRefusedNamingIt) {
  std::unique_ptr<DeviceCopier> devices = NewDeviceCopier();
  if (devices->HasDevice())
    GTEST_SKIP() << "the CUDA runtime sees a device: the refusal needs none";
  auto t = Good();
  t[0].device = Device::Cuda(0);
  std::vector<uint64_t> bytes;
  absl::Status s = ValidateTensorsAndDevices(t, *devices, &bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("tensors[0] (\"w\")"),
            std::string::npos)
      << s;
}

TEST(TensorCheckTest, HostTensorsPassTheDeviceCheck) {
  std::unique_ptr<DeviceCopier> devices = NewDeviceCopier();
  std::vector<uint64_t> bytes;
  absl::Status s = ValidateTensorsAndDevices(Good(), *devices, &bytes);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ckpt::client
