// ckptctl export (a whole step) and ckptctl reshard against a step that a
// real ckptd saved from four ranks holding pieces of global tensors: the
// safetensors file is parsed here (boost's JSON reader, not ours) and every
// tensor compared bit for bit with the global tensor the ranks held; the
// resharded root is served by a second real ckptd to a job of another
// world size, whose ranks restore their pieces bit-exact. Bad inputs are
// refused naming what is wrong, and leave no output behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define BOOST_BIND_GLOBAL_PLACEHOLDERS  // quiets boost 1.74 json_parser
// GCC 12 with -fsanitize flags a false -Wmaybe-uninitialized inside
// boost::optional in property_tree's translator (boost 1.74).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#pragma GCC diagnostic pop

#include "absl/strings/str_cat.h"
#include "storage/keys.h"
#include "tests/await_file.h"
#include "tests/daemon_test.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

constexpr char kJob[] = "sharded";
constexpr uint64_t kStep = 7;
constexpr int kWorld = 4;

CommandResult Ckptctl(const std::string& args) {
  return RunCommand(std::string(CKPTCTL_PATH) + " " + args,
                    /*with_stderr=*/true);
}

// The global tensors the ranks hold pieces of, as bytes.
struct Global {
  std::string dtype;  // safetensors' name
  std::vector<uint64_t> shape;
  std::string bytes;
};

// w: float32 [10, 6], rows [0,3) [3,6) [6,8) on ranks 0-2, and rows 8 and 9
//    as two pieces of rank 3 ("w.a", "w.b");
// e: bfloat16 [4, 8], columns [2r, 2r+2) on rank r (many byte runs);
// b: int64 [5], whole on every rank (data parallel: written once);
// s: float64 scalar, whole on every rank.
std::map<std::string, Global> MakeGlobals() {
  std::map<std::string, Global> g;
  std::vector<float> w(60);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * i - 7.25f;
  g["w"] = {
      "F32", {10, 6}, std::string(reinterpret_cast<char*>(w.data()), 240)};
  std::vector<uint16_t> e(32);
  for (size_t i = 0; i < e.size(); ++i) e[i] = 0x3f80 + 7 * i;
  g["e"] = {"BF16", {4, 8}, std::string(reinterpret_cast<char*>(e.data()), 64)};
  std::vector<int64_t> b = {-3, 1LL << 40, 17, 0, 99};
  g["b"] = {"I64", {5}, std::string(reinterpret_cast<char*>(b.data()), 40)};
  double s = 3.0e-7;
  g["s"] = {"F64", {}, std::string(reinterpret_cast<char*>(&s), 8)};
  return g;
}

// Row-major bytes of the box [offsets, offsets + lengths) of a global tensor.
std::string Slice(const Global& g, size_t elem,
                  const std::vector<uint64_t>& offsets,
                  const std::vector<uint64_t>& lengths) {
  std::string out;
  if (g.shape.empty()) return g.bytes;
  // At most 2 dims here.
  const uint64_t cols = g.shape.size() == 2 ? g.shape[1] : 1;
  const uint64_t r0 = offsets[0], nr = lengths[0];
  const uint64_t c0 = g.shape.size() == 2 ? offsets[1] : 0;
  const uint64_t nc = g.shape.size() == 2 ? lengths[1] : 1;
  for (uint64_t r = r0; r < r0 + nr; ++r)
    out += g.bytes.substr((r * cols + c0) * elem, nc * elem);
  return out;
}

// The tensors one rank saves or restores, over buffers it owns.
struct RankState {
  std::vector<std::string> data;  // one buffer per tensor
  std::vector<Tensor> tensors;
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
           std::string bytes, std::optional<TensorLayout> layout) {
    data.push_back(std::move(bytes));
    tensors.push_back({name, dtype, std::move(shape), nullptr, Device::Host(),
                       std::move(layout)});
  }
  void Bind() {
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].data = data[i].data();
  }
};

class CkptctlStepTest : public DaemonTest {
 protected:
  // Saves kStep from kWorld ranks and waits for its manifest.
  void SaveStep() {
    const std::map<std::string, Global> g = MakeGlobals();
    std::vector<std::unique_ptr<Client>> clients;
    const uint64_t w_rows[] = {0, 3, 6, 8, 10};
    for (int r = 0; r < kWorld; ++r) {
      clients.push_back(Connect(kJob, r, kWorld));
      ASSERT_NE(clients.back(), nullptr);
      RankState st;
      const std::vector<int64_t> wg = {10, 6}, eg = {4, 8};
      if (r < 3) {
        const uint64_t lo = w_rows[r], n = w_rows[r + 1] - lo;
        st.Add("w", DType::kFloat32, {static_cast<int64_t>(n), 6},
               Slice(g.at("w"), 4, {lo, 0}, {n, 6}),
               TensorLayout{wg, {static_cast<int64_t>(lo), 0}, ""});
      } else {
        st.Add("w.a", DType::kFloat32, {1, 6},
               Slice(g.at("w"), 4, {8, 0}, {1, 6}),
               TensorLayout{wg, {8, 0}, "w"});
        st.Add("w.b", DType::kFloat32, {1, 6},
               Slice(g.at("w"), 4, {9, 0}, {1, 6}),
               TensorLayout{wg, {9, 0}, "w"});
      }
      const uint64_t c0 = 2 * static_cast<uint64_t>(r);
      st.Add("e", DType::kBFloat16, {4, 2},
             Slice(g.at("e"), 2, {0, c0}, {4, 2}),
             TensorLayout{eg, {0, static_cast<int64_t>(c0)}, ""});
      st.Add("b", DType::kInt64, {5}, g.at("b").bytes, std::nullopt);
      st.Add("s", DType::kFloat64, {}, g.at("s").bytes, std::nullopt);
      st.Bind();
      ASSERT_TRUE(clients.back()->Save(kStep, st.tensors).ok());
    }
    for (auto& c : clients) ASSERT_TRUE(c->WaitDurable(kStep).ok());
    ASSERT_TRUE(AwaitFile(root() + "/" + storage::ManifestKey(kJob, kStep)));
  }

  std::string Sel() const {
    return absl::StrCat("--root ", root(), " --job ", kJob, " --step ", kStep);
  }
  std::string ShardPath(uint32_t rank) const {
    return root() + "/" + storage::ShardKey(kJob, kStep, rank);
  }
  // Files in `dir` whose name starts with `prefix`.
  static std::vector<std::string> FilesLike(const std::string& dir,
                                            const std::string& prefix) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind(prefix, 0) == 0)
        out.push_back(e.path().filename().string());
    return out;
  }

  TempDir out_;
};

// The safetensors file, read independently of ckptctl's writer: the header
// length, the JSON header (boost), and each tensor's bytes, checking the
// format's rules (8-aligned data, sorted keys packed without holes).
struct Parsed {
  std::map<std::string, std::string> metadata;
  std::map<std::string, Global> tensors;
};
Parsed ReadSafetensors(const std::string& path) {
  Parsed p;
  std::ifstream f(path, std::ios::binary);
  const std::string st((std::istreambuf_iterator<char>(f)),
                       std::istreambuf_iterator<char>());
  EXPECT_GE(st.size(), 8u);
  if (st.size() < 8) return p;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(st[i]);
  EXPECT_LE(8 + n, st.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-aligned";
  boost::property_tree::ptree header;
  std::istringstream in(st.substr(8, n));
  boost::property_tree::read_json(in, header);
  const std::string data = st.substr(8 + n);
  uint64_t end = 0;
  std::string last_key;
  for (const auto& [key, e] : header) {
    if (key == "__metadata__") {
      for (const auto& [k, v] : e) p.metadata[k] = v.get_value<std::string>();
      continue;
    }
    EXPECT_LT(last_key, key) << "keys sorted";
    last_key = key;
    Global g;
    g.dtype = e.get<std::string>("dtype");
    for (const auto& [_, v] : e.get_child("shape"))
      g.shape.push_back(v.get_value<uint64_t>());
    std::vector<uint64_t> off;
    for (const auto& [_, v] : e.get_child("data_offsets"))
      off.push_back(v.get_value<uint64_t>());
    EXPECT_EQ(off.size(), 2u) << key;
    if (off.size() != 2) continue;
    EXPECT_EQ(off[0], end) << key << ": packed in order, no holes";
    EXPECT_LE(off[0], off[1]);
    EXPECT_LE(off[1], data.size());
    g.bytes = data.substr(off[0], off[1] - off[0]);
    end = off[1];
    p.tensors[key] = std::move(g);
  }
  EXPECT_EQ(end, data.size()) << "the header covers every data byte";
  return p;
}

void ExpectGlobals(const Parsed& p, const std::string& where) {
  const std::map<std::string, Global> want = MakeGlobals();
  ASSERT_EQ(p.tensors.size(), want.size()) << where;
  for (const auto& [name, g] : want) {
    auto it = p.tensors.find(name);
    ASSERT_NE(it, p.tensors.end()) << where << ": " << name;
    EXPECT_EQ(it->second.dtype, g.dtype) << where << ": " << name;
    EXPECT_EQ(it->second.shape, g.shape) << where << ": " << name;
    EXPECT_TRUE(it->second.bytes == g.bytes)
        << where << ": " << name << " differs from the global tensor";
  }
}

TEST_F(CkptctlStepTest, ExportAssemblesEveryGlobalTensorBitExact) {
  SaveStep();
  const std::string file = out_.path() + "/model.safetensors";
  CommandResult r = Ckptctl("export " + Sel() + " --out " + file);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("exported 4 tensors of job sharded step 7 (4 ranks"),
            std::string::npos)
      << r.out;
  const Parsed p = ReadSafetensors(file);
  ExpectGlobals(p, "export");
  EXPECT_EQ(p.metadata.at("format"), "pt");
  EXPECT_EQ(p.metadata.at("job"), kJob);
  EXPECT_EQ(p.metadata.at("step"), "7");
  EXPECT_EQ(p.metadata.at("world_size"), "4");

  // An existing file is kept unless --force.
  r = Ckptctl("export " + Sel() + " --out " + file);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--out " + file + ": exists; give --force"),
            std::string::npos)
      << r.out;
  r = Ckptctl("export " + Sel() + " --out " + file + " --force --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"pieces\":17"), std::string::npos) << r.out;
  ExpectGlobals(ReadSafetensors(file), "export --force");
}

TEST_F(CkptctlStepTest, ExportRefusesBadInputsNamingThemAndLeavesNoFile) {
  SaveStep();
  const std::string file = out_.path() + "/bad.safetensors";
  struct Case {
    std::string args, message;
  };
  auto expect_refused = [&](const Case& c) {
    CommandResult r = Ckptctl("export " + c.args + " --out " + file);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos)
        << "expected: " << c.message << "\ngot: " << r.out;
    EXPECT_TRUE(FilesLike(out_.path(), "bad.safetensors").empty())
        << "left behind after: " << c.args;
  };
  expect_refused({absl::StrCat("--root ", root(), " --job nojob --step 7"),
                  "--job nojob: no checkpoint of that job under " + root()});
  expect_refused({absl::StrCat("--root ", root(), " --job ", kJob, " --step 8"),
                  "--step 8: job sharded has no step 8 under " + root()});

  // A corrupt byte in rank 2's piece of "w": the shard and tensor named.
  const std::string rank2 = ShardPath(2);
  std::string saved2;
  {
    std::ifstream f(rank2, std::ios::binary);
    saved2.assign(std::istreambuf_iterator<char>(f), {});
  }
  FlipFirstTensorByteOfFile(rank2);
  expect_refused({Sel(), storage::ShardKey(kJob, kStep, 2) +
                             ": tensor \"w\": checksum mismatch"});
  std::ofstream(rank2, std::ios::binary | std::ios::trunc) << saved2;

  // A listed shard that is missing: its rank and key named.
  ASSERT_EQ(unlink(ShardPath(1).c_str()), 0);
  expect_refused({Sel(), "rank 1: shard " + storage::ShardKey(kJob, kStep, 1)});

  // Not complete: no manifest.
  ASSERT_EQ(unlink((root() + "/" + storage::ManifestKey(kJob, kStep)).c_str()),
            0);
  expect_refused({Sel(), "--step 7: job sharded step 7 is not complete"});
}

// The step resharded from 4 to 3 ranks into a new root; a ckptd on that
// root serves it to a job of 3 ranks, each restoring its torch.chunk piece
// of every sharded tensor (and every whole tensor) bit-exact.
TEST_F(CkptctlStepTest, ReshardWritesARootACkptdServesToTheNewWorldSize) {
  SaveStep();
  const std::string root2 = out_.path() + "/root3";
  CommandResult r =
      Ckptctl(absl::StrCat("reshard ", Sel(), " --world-size 3 --out ", root2));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("from 4 to 3 ranks (4 tensors, 2 split"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(Ckptctl("verify --root " + root2).exit_code, 0);

  TempDir run2;
  ArenaPrefixes prefixes;
  auto d2 = DaemonProcess::Start(root2, run2.path(), prefixes.New());
  ASSERT_TRUE(d2.ok()) << d2.status();
  const std::map<std::string, Global> g = MakeGlobals();
  // torch.chunk(3): w rows ceil(10/3) = 4 -> [0,4) [4,8) [8,10);
  // e columns ceil(8/3) = 3 -> [0,3) [3,6) [6,8).
  const uint64_t w_lo[] = {0, 4, 8}, w_n[] = {4, 4, 2};
  const uint64_t e_lo[] = {0, 3, 6}, e_n[] = {3, 3, 2};
  for (int rank = 0; rank < 3; ++rank) {
    auto c = Client::Connect(OptionsFor(**d2, kJob, rank, 3));
    ASSERT_TRUE(c.ok()) << c.status();
    RankState st;
    st.Add("b", DType::kInt64, {5}, std::string(40, '\0'), std::nullopt);
    st.Add("e", DType::kBFloat16, {4, static_cast<int64_t>(e_n[rank])},
           std::string(8 * e_n[rank], '\0'),
           TensorLayout{{4, 8}, {0, static_cast<int64_t>(e_lo[rank])}, ""});
    st.Add("s", DType::kFloat64, {}, std::string(8, '\0'), std::nullopt);
    st.Add("w", DType::kFloat32, {static_cast<int64_t>(w_n[rank]), 6},
           std::string(24 * w_n[rank], '\0'),
           TensorLayout{{10, 6}, {static_cast<int64_t>(w_lo[rank]), 0}, ""});
    st.Bind();
    std::vector<std::optional<TensorLayout>> layouts;
    absl::Status s = (*c)->Restore(kStep, st.tensors, &layouts);
    ASSERT_TRUE(s.ok()) << "rank " << rank << ": " << s;
    EXPECT_TRUE(st.data[0] == g.at("b").bytes) << rank;
    EXPECT_TRUE(st.data[1] ==
                Slice(g.at("e"), 2, {0, e_lo[rank]}, {4, e_n[rank]}))
        << rank;
    EXPECT_TRUE(st.data[2] == g.at("s").bytes) << rank;
    EXPECT_TRUE(st.data[3] ==
                Slice(g.at("w"), 4, {w_lo[rank], 0}, {w_n[rank], 6}))
        << rank;
    ASSERT_EQ(layouts.size(), 4u);
    EXPECT_EQ(layouts[0], std::nullopt);
    EXPECT_EQ(layouts[3], st.tensors[3].layout);
  }

  // Round trip: the new root exports to the same global tensors, also at
  // a world size with an empty chunk (e over 5 ranks: [8, 8) on rank 4).
  const std::string root5 = out_.path() + "/root5";
  r = Ckptctl(absl::StrCat("reshard --root ", root2, " --job ", kJob,
                           " --step ", kStep, " --world-size 5 --out ", root5));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const std::string& rt : {root2, root5}) {
    const std::string file = rt + ".safetensors";
    r = Ckptctl(absl::StrCat("export --root ", rt, " --job ", kJob, " --step ",
                             kStep, " --out ", file));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    ExpectGlobals(ReadSafetensors(file), rt);
  }
}

TEST_F(CkptctlStepTest, ReshardRefusesBadInputsNamingThemAndLeavesNothing) {
  SaveStep();
  const std::string root2 = out_.path() + "/new";
  auto expect_refused = [&](const std::string& args,
                            const std::string& message) {
    CommandResult r = Ckptctl("reshard " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos)
        << "expected: " << message << "\ngot: " << r.out;
    EXPECT_TRUE(FilesLike(out_.path(), "new.partial").empty())
        << "left behind after: " << args;
  };
  expect_refused(Sel() + " --world-size 0 --out " + root2,
                 "--world-size: 0 is not in [1, ");
  EXPECT_FALSE(std::filesystem::exists(root2));
  std::filesystem::create_directories(root2);
  std::ofstream(root2 + "/keep") << "x";
  expect_refused(Sel() + " --world-size 2 --out " + root2,
                 "--out " + root2 + ": exists");
  EXPECT_EQ(FilesLike(root2, ""), std::vector<std::string>{"keep"});
  std::filesystem::remove_all(root2);
  ASSERT_EQ(unlink((root() + "/" + storage::ManifestKey(kJob, kStep)).c_str()),
            0);
  expect_refused(Sel() + " --world-size 2 --out " + root2,
                 "job sharded step 7 is not complete");
  EXPECT_FALSE(std::filesystem::exists(root2));
}

}  // namespace
}  // namespace ckpt::testing
