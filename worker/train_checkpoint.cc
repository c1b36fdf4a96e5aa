#include "worker/train_checkpoint.h"

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::worker {

namespace {

// Host memory in both cases: the only Device the trainer drives today is the
// host-budget one, whose "device memory" is host memory.
ckpt::Device MemoryOf(const ChunkedAdam::MasterState&) {
  return ckpt::Device::Host();
}

}  // namespace

TrainCheckpoint::TrainCheckpoint(const MlpConfig& model, int world_size,
                                 ChunkedAdam* optimizer)
    : model_(model),
      world_size_(world_size),
      optimizer_(optimizer),
      shapes_(MlpParamShapes(model)) {}

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
  meta_model_[0] = kCheckpointLayoutVersion;
  meta_model_[1] = model_.vocab;
  meta_model_[2] = model_.dim;
  meta_model_[3] = model_.layers;
  meta_model_[4] = world_size_;
  std::vector<Tensor> out;
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
  if (meta_model_[0] != kCheckpointLayoutVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "meta/model layout version ", meta_model_[0],
                     ", expected ", kCheckpointLayoutVersion));
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
  auto read = [&](std::span<const Tensor> tensors) {
    return from ? client.RestoreSavedRank(step, from->rank, tensors)
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
  CKPT_ASSIGN_OR_RETURN(std::vector<Tensor> all,
                        TensorsFor(step, meta_rng_[0]));
  all.resize(3 * shapes_.size());  // the state; meta is already read
  if (absl::Status s = read(all); !s.ok()) {
    return Annotate(s, absl::StrCat("checkpoint step ", step));
  }
  CKPT_RETURN_IF_ERROR(optimizer_->ReloadMasterState(step));
  return RestoredState{step, static_cast<uint64_t>(meta_rng_[0])};
}

}  // namespace ckpt::worker
