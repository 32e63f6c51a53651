#include "runtime/cuda_backend.h"

#include <algorithm>
#include <optional>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "model/mtp_feed.h"

namespace dsv4 {

namespace {

// A sequence's whole device state: the target's, and with MTP the module's and its feed.
struct CudaState {
  explicit CudaState(DeviceSequence s) : seq(std::move(s)) {}
  DeviceSequence seq;
  std::optional<DeviceSequence> mtp;
  MtpFeed feed;
  int64_t pos() const { return seq.pos; }
  size_t bytes() const { return seq.bytes() + (mtp ? mtp->bytes() : 0) + feed.bytes(); }
};

struct CudaSequence final : BackendSequence {
  explicit CudaSequence(CudaState s) : st(std::move(s)) {}
  CudaState st;
  int64_t pos() const override { return st.pos(); }
  size_t bytes() const override { return st.bytes(); }
};

struct CudaSnapshot final : BackendSnapshot {
  explicit CudaSnapshot(CudaState s) : st(std::move(s)) {}
  CudaState st;
  int64_t pos() const override { return st.pos(); }
  size_t bytes() const override { return st.bytes(); }
};

CudaState& dev_state(BackendSequence* s) {
  auto* c = dynamic_cast<CudaSequence*>(s);
  DSV4_CHECK(c, "CudaBackend: sequence of another backend");
  return c->st;
}

// Rows of MTP draft steps a round may feed back (each saved once, before the first).
constexpr int64_t kMaxFeedbackRows = 16;

}  // namespace

CudaBackend::CudaBackend(CudaModel& model, bool mtp) : model_(&model), mtp_(mtp) {
  DSV4_CHECK(!mtp || model.has_mtp(), "CudaBackend: speculative decoding needs the checkpoint's mtp.* tensors");
}

// A fresh state of `capacity` tokens, with the MTP parts when speculative decoding is on.
static CudaState make_state(const CudaModel& model, bool mtp, int64_t capacity) {
  CudaState st(model.new_sequence(capacity));
  if (mtp) {
    const ModelConfig& cfg = model.config();
    st.mtp.emplace(model.new_mtp_sequence(capacity));
    st.feed = MtpFeed(cfg.hc_mult * cfg.hidden_size, cfg.sliding_window);
  }
  return st;
}

std::unique_ptr<BackendSequence> CudaBackend::new_sequence(int64_t capacity) {
  return std::make_unique<CudaSequence>(make_state(*model_, mtp_, std::max<int64_t>(capacity, 1)));
}

std::vector<float> CudaBackend::forward(std::span<const BackendChunk> chunks) {
  std::vector<DeviceChunk> dc;
  dc.reserve(chunks.size());
  for (const auto& c : chunks) {
    CudaState& st = dev_state(c.seq);
    DSV4_CHECK(c.verify || !st.feed.drafting(), "speculative: drafts must be verified");
    // A verify chunk saves the ring rows it overwrites, so accept() can roll the rejected ones back.
    if (c.verify) st.seq.begin_verify(static_cast<int64_t>(c.tokens.size()), model_->stream());
    dc.push_back({&st.seq, c.tokens, c.verify});
  }
  std::vector<float> hidden;
  std::vector<float> all = model_->forward(dc, false, mtp_ ? &hidden : nullptr);  // every row of verify chunks
  const size_t V = static_cast<size_t>(model_->config().vocab_size);
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size;
  size_t in = 0, out = 0, row = 0;  // rows read from `all`, rows kept (out <= in: compacted in place)
  for (const auto& c : chunks) {
    if (mtp_) {
      CudaState& st = dev_state(c.seq);
      st.feed.push(st.seq.pos - static_cast<int64_t>(c.tokens.size()), c.tokens, hidden.data() + row * hd);
      row += c.tokens.size();
    }
    const size_t rows = c.verify ? c.tokens.size() : 1;
    if (c.verify || c.want_logits) {
      if (out != in) std::copy(all.begin() + in * V, all.begin() + (in + rows) * V, all.begin() + out * V);
      out += rows;
    }
    in += rows;
  }
  all.resize(out * V);
  return all;
}

std::vector<float> CudaBackend::draft(std::span<BackendSequence* const> seqs, std::span<const int32_t> tokens) {
  DSV4_CHECK(mtp_, "speculative: the backend was created without the MTP module");
  DSV4_CHECK(seqs.size() == tokens.size(), "speculative: one token per sequence");
  std::vector<MtpFeed::Step> steps;
  steps.reserve(seqs.size());
  std::vector<DeviceMtpChunk> chunks;
  for (size_t i = 0; i < seqs.size(); ++i) {
    CudaState& st = dev_state(seqs[i]);
    steps.push_back(st.feed.step(st.seq.pos, st.mtp->pos, tokens[i]));
    const MtpFeed::Step& step = steps.back();
    if (step.feedback && st.mtp->verify_start() < 0)  // the draft rows are undone by accept()
      st.mtp->begin_verify(std::min(st.mtp->max_verify_tokens(), kMaxFeedbackRows), model_->stream());
    st.mtp->pos = step.start;
    chunks.push_back({&*st.mtp, step.streams, step.next});
  }
  std::vector<float> streams;
  std::vector<float> logits = model_->mtp_forward(chunks, false, &streams);
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    CudaState& st = dev_state(seqs[i]);
    st.feed.stepped(streams.data() + i * hd, st.seq.pos);
  }
  return logits;
}

void CudaBackend::accept(BackendSequence& seq, int64_t new_pos) {
  CudaState& st = dev_state(&seq);
  st.seq.truncate(new_pos, model_->stream());
  if (st.mtp) {
    if (st.mtp->verify_start() >= 0) st.mtp->truncate(st.mtp->verify_start(), model_->stream());
    st.feed.accept(new_pos);
  }
}

// A copy of `src` able to hold `capacity` tokens (device copies ordered on the model's stream).
static CudaState copy_state(const CudaModel& model, bool mtp, const CudaState& src, int64_t capacity) {
  CudaState st = make_state(model, mtp && src.mtp.has_value(), capacity);
  st.seq.copy_state_from(src.seq, model.stream());
  if (st.mtp) {
    st.mtp->copy_state_from(*src.mtp, model.stream());
    st.feed = src.feed;
  }
  DSV4_CUDA_CHECK(cudaStreamSynchronize(model.stream()));
  return st;
}

std::unique_ptr<BackendSnapshot> CudaBackend::snapshot(const BackendSequence& seq) {
  const auto* c = dynamic_cast<const CudaSequence*>(&seq);
  DSV4_CHECK(c, "CudaBackend: sequence of another backend");
  return std::make_unique<CudaSnapshot>(copy_state(*model_, mtp_, c->st, std::max<int64_t>(c->st.pos(), 1)));
}

std::unique_ptr<BackendSequence> CudaBackend::restore(const BackendSnapshot& snap, int64_t capacity) {
  const auto* c = dynamic_cast<const CudaSnapshot*>(&snap);
  DSV4_CHECK(c, "CudaBackend: snapshot of another backend");
  return std::make_unique<CudaSequence>(copy_state(*model_, mtp_, c->st, std::max(capacity, c->st.pos() + 1)));
}

}  // namespace dsv4
