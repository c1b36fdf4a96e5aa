// Test helpers for layouts: grids of boxes, indexes built from them, and a
// plan executor that copies real bytes so a test checks values, not only
// counts. Test-only.
#ifndef CKPT_STORAGE_LAYOUT_TESTING_H_
#define CKPT_STORAGE_LAYOUT_TESTING_H_

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/reshard_plan.h"

namespace ckpt::storage::testing {

// parts + 1 boundaries splitting n as evenly as possible.
inline std::vector<uint64_t> EvenCuts(uint64_t n, uint64_t parts) {
  std::vector<uint64_t> c;
  for (uint64_t i = 0; i <= parts; ++i) c.push_back(n * i / parts);
  return c;
}

// The boxes of a grid (row-major over the cells), per dim the boundaries.
inline std::vector<Box> GridBoxes(
    const std::vector<std::vector<uint64_t>>& cuts) {
  std::vector<Box> out(1);
  out[0].ndim = 0;
  for (uint32_t d = 0; d < cuts.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out)
      for (size_t i = 0; i + 1 < cuts[d].size(); ++i) {
        if (cuts[d][i + 1] == cuts[d][i]) continue;
        Box n = b;
        n.ndim = d + 1;
        n.offsets[d] = cuts[d][i];
        n.lengths[d] = cuts[d][i + 1] - cuts[d][i];
        next.push_back(n);
      }
    out = std::move(next);
  }
  return out;
}

struct TestPiece {
  std::string tensor;
  uint32_t rank;
  Box box;
};
struct TestTensor {
  std::string name;
  std::vector<uint64_t> shape;
};

// dtype int32 everywhere: element values are their global row-major index.
inline LayoutIndex MakeIndex(uint32_t world,
                             const std::vector<TestTensor>& tensors,
                             const std::vector<TestPiece>& pieces) {
  LayoutIndexBuilder b(world);
  for (const TestTensor& t : tensors)
    EXPECT_TRUE(b.AddTensor(t.name, DType::kInt32, t.shape).ok());
  for (const TestPiece& p : pieces) {
    absl::StatusOr<uint32_t> id = b.AddTensor(
        p.tensor, DType::kInt32,
        tensors[std::find_if(
                    tensors.begin(), tensors.end(),
                    [&](const TestTensor& t) { return t.name == p.tensor; }) -
                tensors.begin()]
            .shape);
    EXPECT_TRUE(id.ok());
    absl::Status s =
        b.AddPiece(*id, p.rank, 0,
                   std::span<const uint64_t>(p.box.offsets.data(), p.box.ndim),
                   std::span<const uint64_t>(p.box.lengths.data(), p.box.ndim));
    EXPECT_TRUE(s.ok()) << s;
  }
  absl::StatusOr<LayoutIndex> idx = std::move(b).Finish();
  EXPECT_TRUE(idx.ok()) << idx.status();
  return *std::move(idx);
}

// The global row-major index of each element of piece p.
inline std::vector<uint32_t> PieceValues(const LayoutIndex& idx, uint64_t p) {
  const LayoutTensor& t = idx.tensors()[idx.piece_tensor(p)];
  const Box box = idx.PieceBox(p);
  std::vector<uint32_t> v(box.Elements());
  uint64_t pos[kMaxTensorDims] = {};
  for (uint64_t e = 0; e < v.size(); ++e) {
    uint64_t g = 0;
    for (uint32_t d = 0; d < t.ndim; ++d)
      g = g * t.global_shape[d] + box.offsets[d] + pos[d];
    v[e] = static_cast<uint32_t>(g);
    for (int d = static_cast<int>(t.ndim) - 1; d >= 0; --d) {
      if (++pos[d] < box.lengths[d]) break;
      pos[d] = 0;
    }
  }
  return v;
}

// Runs the reads with real copies; expects every requested element written
// exactly once with its global value. Returns the number of reads.
inline uint64_t ExecuteAndCheck(const LayoutIndex& saved,
                                const LayoutIndex& requested,
                                const std::vector<PlannedRead>& reads) {
  std::vector<std::vector<uint32_t>> dest(requested.num_pieces()),
      count(requested.num_pieces());
  for (uint64_t q = 0; q < requested.num_pieces(); ++q) {
    dest[q].assign(requested.PieceBox(q).Elements(), 0xFFFFFFFFu);
    count[q].assign(dest[q].size(), 0);
  }
  std::vector<std::vector<uint32_t>> src(saved.num_pieces());
  for (const PlannedRead& r : reads) {
    if (src[r.saved_piece].empty())
      src[r.saved_piece] = PieceValues(saved, r.saved_piece);
    ForEachByteRun(
        saved, requested, r, [&](uint64_t so, uint64_t dof, uint64_t n) {
          EXPECT_EQ(n % 4, 0u);
          EXPECT_LE(so + n, src[r.saved_piece].size() * 4);
          EXPECT_LE(dof + n, dest[r.request].size() * 4);
          std::memcpy(
              reinterpret_cast<char*>(dest[r.request].data()) + dof,
              reinterpret_cast<const char*>(src[r.saved_piece].data()) + so, n);
          for (uint64_t e = dof / 4; e < (dof + n) / 4; ++e)
            ++count[r.request][e];
        });
  }
  for (uint64_t q = 0; q < requested.num_pieces(); ++q) {
    EXPECT_EQ(dest[q], PieceValues(requested, q)) << "request " << q;
    for (size_t e = 0; e < count[q].size(); ++e)
      if (count[q][e] != 1) {
        ADD_FAILURE() << "request " << q << " element " << e << " written "
                      << count[q][e] << " times";
        break;
      }
  }
  return reads.size();
}

inline std::vector<PlannedRead> Flatten(
    const std::vector<std::vector<PlannedRead>>& by_rank) {
  std::vector<PlannedRead> out;
  for (const auto& r : by_rank) out.insert(out.end(), r.begin(), r.end());
  return out;
}

// The TensorMeta of a float32 piece: its shape, its place in a global
// tensor when it has one (global shape and offsets; empty: a whole
// tensor), and its data offset in the shard.
inline ::ckpt::v1::TensorMeta Float32Piece(
    const std::string& name, const std::vector<uint64_t>& shape,
    const std::vector<uint64_t>& global = {},
    const std::vector<uint64_t>& offsets = {}, uint64_t at = 0) {
  ::ckpt::v1::TensorMeta m;
  m.set_name(name);
  m.set_dtype(static_cast<uint32_t>(DType::kFloat32));
  uint64_t n = 4;
  for (uint64_t d : shape) {
    m.add_shape(d);
    n *= d;
  }
  m.set_bytes(n);
  m.set_offset(at);
  for (uint64_t d : global) m.add_global_shape(d);
  for (uint64_t d : offsets) m.add_piece_offsets(d);
  return m;
}

}  // namespace ckpt::storage::testing

#endif  // CKPT_STORAGE_LAYOUT_TESTING_H_
