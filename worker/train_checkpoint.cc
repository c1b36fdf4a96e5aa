#include "worker/train_checkpoint.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::worker {

namespace {

// Host memory in both cases: the only Device the trainer drives today is the
// host-budget one, whose "device memory" is host memory.
ckpt::Device MemoryOf(const ChunkedAdam::MasterState&) {
  return ckpt::Device::Host();
}

int64_t LayoutVersion(bool zero1) {
  return zero1 ? kZero1LayoutVersion : kCheckpointLayoutVersion;
}

}  // namespace

std::vector<size_t> Zero1Bounds(size_t total, int world) {
  std::vector<size_t> b(static_cast<size_t>(world) + 1);
  for (int r = 0; r <= world; ++r)
    b[r] = static_cast<size_t>(static_cast<unsigned __int128>(total) * r /
                               static_cast<unsigned>(world));
  return b;
}

std::vector<StatePiece> PiecesOf(const std::vector<size_t>& numels, size_t lo,
                                 size_t hi) {
  std::vector<StatePiece> out;
  size_t start = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const size_t end = start + numels[i];
    const size_t a = std::max(lo, start), b = std::min(hi, end);
    if (a < b) out.push_back({i, a - start, b - a});
    start = end;
  }
  return out;
}

TrainCheckpoint::TrainCheckpoint(const MlpConfig& model, int world_size,
                                 ChunkedAdam* optimizer, bool zero1,
                                 std::vector<StatePiece> pieces)
    : model_(model),
      world_size_(world_size),
      optimizer_(optimizer),
      zero1_(zero1),
      shapes_(MlpParamShapes(model)),
      pieces_(std::move(pieces)) {}

Tensor TrainCheckpoint::Meta(const char* name, int64_t* data, int64_t count) {
  Tensor t;
  t.name = name;
  t.dtype = DType::kInt64;
  t.shape = {count};
  t.data = data;
  return t;
}

absl::StatusOr<std::vector<Tensor>> TrainCheckpoint::TensorsFor(
    int64_t step, uint64_t data_seed) {
  meta_step_[0] = step;
  meta_rng_[0] = static_cast<int64_t>(data_seed);
  meta_rng_[1] = step;  // the data position is the step
  meta_model_[0] = LayoutVersion(zero1_);
  meta_model_[1] = model_.vocab;
  meta_model_[2] = model_.dim;
  meta_model_[3] = model_.layers;
  meta_model_[4] = world_size_;
  std::vector<Tensor> out;
  if (zero1_) {
    out.reserve(3 * pieces_.size() + 3);
    for (size_t j = 0; j < pieces_.size(); ++j) {
      const StatePiece& piece = pieces_[j];
      CKPT_ASSIGN_OR_RETURN(ChunkedAdam::MasterState st,
                            optimizer_->MasterStateOf(j));
      for (auto [prefix, data] :
           {std::pair{"param/", st.p}, {"adam_m/", st.m}, {"adam_v/", st.v}}) {
        Tensor t;
        t.name = absl::StrCat(prefix, piece.tensor);
        t.dtype = DType::kFloat32;
        t.shape = {static_cast<int64_t>(piece.numel)};
        t.data = data;
        t.device = MemoryOf(st);
        t.layout =
            TensorLayout{{static_cast<int64_t>(shapes_[piece.tensor].numel)},
                         {static_cast<int64_t>(piece.offset)},
                         ""};
        out.push_back(std::move(t));
      }
    }
    out.push_back(Meta("meta/step", meta_step_, 1));
    out.push_back(Meta("meta/rng", meta_rng_, 2));
    out.push_back(Meta("meta/model", meta_model_, 5));
    return out;
  }
  out.reserve(3 * shapes_.size() + 3);
  for (size_t i = 0; i < shapes_.size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(ChunkedAdam::MasterState st,
                          optimizer_->MasterStateOf(i));
    for (auto [prefix, data] :
         {std::pair{"param/", st.p}, {"adam_m/", st.m}, {"adam_v/", st.v}}) {
      Tensor t;
      t.name = absl::StrCat(prefix, i);
      t.dtype = DType::kFloat32;
      t.shape = shapes_[i].shape;
      t.data = data;
      t.device = MemoryOf(st);
      out.push_back(std::move(t));
    }
  }
  out.push_back(Meta("meta/step", meta_step_, 1));
  out.push_back(Meta("meta/rng", meta_rng_, 2));
  out.push_back(Meta("meta/model", meta_model_, 5));
  return out;
}

absl::Status TrainCheckpoint::CheckMeta(int64_t step, int64_t world) const {
  std::string where = absl::StrCat("checkpoint step ", step, ": ");
  // Either mode reads the other's checkpoint (Restore).
  if (meta_model_[0] != kCheckpointLayoutVersion &&
      meta_model_[0] != kZero1LayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "meta/model layout version ", meta_model_[0], ", expected ",
        kCheckpointLayoutVersion, " (plain data parallel) or ",
        kZero1LayoutVersion, " (ZeRO-1)"));
  }
  if (meta_model_[4] != world) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "written by a job of world size ", meta_model_[4],
                     world == world_size_ ? ", this run has world size "
                                          : ", the saved rank's world size is ",
                     world));
  }
  const int64_t mine[3] = {model_.vocab, model_.dim, model_.layers};
  const char* names[3] = {"vocab", "dim", "layers"};
  for (int i = 0; i < 3; ++i) {
    if (meta_model_[1 + i] != mine[i]) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, "model has ", names[i], " = ", meta_model_[1 + i],
                       ", this run has ", names[i], " = ", mine[i],
                       " (checkpoint model: vocab ", meta_model_[1], ", dim ",
                       meta_model_[2], ", layers ", meta_model_[3], ")"));
    }
  }
  if (meta_step_[0] != step) {
    return absl::DataLossError(
        absl::StrCat(where, "meta/step holds ", meta_step_[0]));
  }
  if (meta_rng_[1] != step) {
    return absl::DataLossError(absl::StrCat(where, "meta/rng data position ",
                                            meta_rng_[1], " is not the step"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RestoredState> TrainCheckpoint::Restore(
    Client& client, int64_t step, std::optional<SavedRank> from) {
  std::vector<Tensor> meta = {Meta("meta/step", meta_step_, 1),
                              Meta("meta/rng", meta_rng_, 2),
                              Meta("meta/model", meta_model_, 5)};
  // ZeRO-1 never reads one saved rank's shard: Restore plans this rank's
  // slice over every saved rank's pieces (the meta is whole on each).
  auto read = [&](std::span<const Tensor> tensors) {
    return from && !zero1_ ? client.RestoreSavedRank(step, from->rank, tensors)
                           : client.Restore(step, tensors);
  };
  if (absl::Status s = read(meta); !s.ok()) {
    return Annotate(
        s, absl::StrCat("checkpoint step ", step,
                        ": not a ckpt-worker checkpoint (reading meta/*)"));
  }
  CKPT_RETURN_IF_ERROR(
      CheckMeta(step, from ? static_cast<int64_t>(from->world_size)
                           : static_cast<int64_t>(world_size_)));
  const bool saved_zero1 = meta_model_[0] == kZero1LayoutVersion;
  const uint64_t data_seed = static_cast<uint64_t>(meta_rng_[0]);
  absl::Status s;
  if (saved_zero1 == zero1_) {
    CKPT_ASSIGN_OR_RETURN(std::vector<Tensor> all, TensorsFor(step, data_seed));
    all.resize(all.size() - 3);  // the state; meta is already read
    s = read(all);
  } else if (zero1_) {
    s = ReadSlicesOfWhole(client, step, from);
  } else {
    s = ReadWholeFromPieces(client, step);
  }
  if (!s.ok()) return Annotate(s, absl::StrCat("checkpoint step ", step));
  CKPT_RETURN_IF_ERROR(optimizer_->ReloadMasterState(step));
  return RestoredState{step, data_seed};
}

absl::Status TrainCheckpoint::ReadSlicesOfWhole(Client& client, int64_t step,
                                                std::optional<SavedRank> from) {
  // Each tensor this rank's slice touches, whole, then the slice of it.
  std::vector<size_t> touched;
  for (const StatePiece& p : pieces_)
    if (touched.empty() || touched.back() != p.tensor)
      touched.push_back(p.tensor);
  std::vector<std::vector<float>> buffers(3 * touched.size());
  std::vector<Tensor> whole;
  for (size_t k = 0; k < touched.size(); ++k) {
    const ParamShape& shape = shapes_[touched[k]];
    const char* prefixes[3] = {"param/", "adam_m/", "adam_v/"};
    for (int x = 0; x < 3; ++x) {
      buffers[3 * k + x].resize(shape.numel);
      Tensor t;
      t.name = absl::StrCat(prefixes[x], touched[k]);
      t.dtype = DType::kFloat32;
      t.shape = shape.shape;
      t.data = buffers[3 * k + x].data();
      whole.push_back(std::move(t));
    }
  }
  CKPT_RETURN_IF_ERROR(from ? client.RestoreSavedRank(step, from->rank, whole)
                            : client.Restore(step, whole));
  for (size_t j = 0; j < pieces_.size(); ++j) {
    const StatePiece& p = pieces_[j];
    const size_t k = static_cast<size_t>(
        std::find(touched.begin(), touched.end(), p.tensor) - touched.begin());
    CKPT_ASSIGN_OR_RETURN(ChunkedAdam::MasterState st,
                          optimizer_->MasterStateOf(j));
    float* dst[3] = {st.p, st.m, st.v};
    for (int x = 0; x < 3; ++x)
      std::copy_n(buffers[3 * k + x].data() + p.offset, p.numel, dst[x]);
  }
  return absl::OkStatus();
}

absl::Status TrainCheckpoint::ReadWholeFromPieces(Client& client,
                                                  int64_t step) {
  // Every tensor whole, in the 1-D layout its pieces were saved in: the
  // client plans it over every saved rank's pieces.
  std::vector<Tensor> all;
  for (size_t i = 0; i < shapes_.size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(ChunkedAdam::MasterState st,
                          optimizer_->MasterStateOf(i));
    const auto n = static_cast<int64_t>(shapes_[i].numel);
    for (auto [prefix, data] :
         {std::pair{"param/", st.p}, {"adam_m/", st.m}, {"adam_v/", st.v}}) {
      Tensor t;
      t.name = absl::StrCat(prefix, i);
      t.dtype = DType::kFloat32;
      t.shape = {n};
      t.data = data;
      t.device = MemoryOf(st);
      t.layout = TensorLayout{{n}, {0}, ""};
      all.push_back(std::move(t));
    }
  }
  return client.Restore(step, all);
}

}  // namespace ckpt::worker
