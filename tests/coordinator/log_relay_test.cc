// Unit tests for LogRelay (coordinator/log_relay.h), written against its
// header contract: one thread, a FakeClock, recording sinks and upload
// controls standing in for the readers' and the agents' calls.
#include "coordinator/log_relay.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "mesh/v1/job.pb.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace log_relay_test {

namespace v1 = ::mesh::v1;

using ::mesh::testing::IsOk;
using ::mesh::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr absl::Duration kAttachTimeout = absl::Seconds(10);

// Keeps every chunk and the end status; flags breaches of the sink rules.
class RecordingSink final : public LogSink {
 public:
  void Send(const v1::LogChunk& chunk) override {
    if (ended()) ADD_FAILURE() << "Send after End: " << chunk.ShortDebugString();
    chunks_.emplace_back(chunk.rank(), chunk.data());
  }
  void End(const absl::Status& status) override {
    if (ended()) ADD_FAILURE() << "End called twice: first " << *status_ << ", then " << status;
    status_ = status;
  }

  const std::vector<std::pair<int, std::string>>& chunks() const { return chunks_; }
  bool ended() const { return status_.has_value(); }
  absl::Status status() const { return status_.value_or(absl::UnknownError("not ended")); }

 private:
  std::vector<std::pair<int, std::string>> chunks_;
  std::optional<absl::Status> status_;
};

class RecordingControl final : public UploadControl {
 public:
  void Abort(const absl::Status& status) override {
    ++aborts_;
    status_ = status;
  }
  int aborts() const { return aborts_; }
  const absl::Status& status() const { return status_; }

 private:
  int aborts_ = 0;
  absl::Status status_;
};

v1::LogChunk Chunk(int rank, const std::string& data, bool eof = false) {
  v1::LogChunk chunk;
  chunk.set_rank(rank);
  chunk.set_data(data);
  chunk.set_eof(eof);
  return chunk;
}

class LogRelayTest : public ::testing::Test {
 protected:
  // A request for ranks 0, 1 on node-a and rank 2 on node-b.
  uint64_t StartTwoNodes() {
    absl::StatusOr<uint64_t> handle = relay_.Start({{"node-a", {0, 1}}, {"node-b", {2}}}, &sink_);
    EXPECT_THAT(handle, IsOk());
    return handle.value_or(0);
  }

  uint64_t Attach(const std::string& node, uint64_t request, RecordingControl* control) {
    absl::StatusOr<uint64_t> upload = relay_.Attach(node, LogRelay::RequestId(request), control);
    EXPECT_THAT(upload, IsOk());
    return upload.value_or(0);
  }

  FakeClock clock_;
  LogRelay relay_{&clock_, kAttachTimeout};
  RecordingSink sink_;
};

TEST_F(LogRelayTest, RelaysChunksInOrderAndEndsOkAfterEveryRanksEof) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a, control_b;
  const uint64_t a = Attach("node-a", request, &control_a);
  const uint64_t b = Attach("node-b", request, &control_b);

  EXPECT_THAT(relay_.Chunk(a, Chunk(0, "a0 line\n")), IsOk());
  EXPECT_THAT(relay_.Chunk(b, Chunk(2, "b2 line\n", /*eof=*/true)), IsOk());
  EXPECT_THAT(relay_.Chunk(a, Chunk(1, "a1 line\n", /*eof=*/true)), IsOk());
  EXPECT_FALSE(sink_.ended()) << "rank 0 has not sent its eof";
  EXPECT_THAT(relay_.Chunk(a, Chunk(0, "", /*eof=*/true)), IsOk());

  EXPECT_THAT(sink_.chunks(), ElementsAre(Pair(0, "a0 line\n"), Pair(2, "b2 line\n"),
                                          Pair(1, "a1 line\n"), Pair(0, "")));
  ASSERT_TRUE(sink_.ended());
  EXPECT_THAT(sink_.status(), IsOk());
  // Both uploads delivered everything and end by themselves.
  EXPECT_EQ(control_a.aborts(), 0);
  EXPECT_EQ(control_b.aborts(), 0);
  EXPECT_EQ(relay_.active_requests(), 0);
  relay_.UploadEnded(a, absl::OkStatus());
  relay_.UploadEnded(b, absl::OkStatus());
  EXPECT_EQ(sink_.chunks().size(), 4u);
}

TEST_F(LogRelayTest, StartRejectsAnEmptyRequest) {
  EXPECT_THAT(relay_.Start({}, &sink_), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(relay_.Start({{"node-a", {}}}, &sink_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node-a")));
  EXPECT_EQ(relay_.active_requests(), 0);
}

TEST_F(LogRelayTest, RequestIdsAreDistinctAndNameTheirRequest) {
  RecordingSink other;
  const absl::StatusOr<uint64_t> first = relay_.Start({{"node-a", {0}}}, &sink_);
  const absl::StatusOr<uint64_t> second = relay_.Start({{"node-a", {0}}}, &other);
  ASSERT_THAT(first, IsOk());
  ASSERT_THAT(second, IsOk());
  EXPECT_NE(LogRelay::RequestId(*first), LogRelay::RequestId(*second));
  EXPECT_EQ(LogRelay::RequestId(7), "logs-7");

  RecordingControl control;
  const uint64_t upload = Attach("node-a", *second, &control);
  EXPECT_THAT(relay_.Chunk(upload, Chunk(0, "x", /*eof=*/true)), IsOk());
  EXPECT_TRUE(other.ended());
  EXPECT_FALSE(sink_.ended()) << "a chunk reached the wrong request";
}

TEST_F(LogRelayTest, AttachErrors) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control;
  EXPECT_THAT(relay_.Attach("node-a", "logs-x", &control),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("unknown log request")));
  EXPECT_THAT(relay_.Attach("node-a", "request-1", &control),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(relay_.Attach("node-a", LogRelay::RequestId(request + 100), &control),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("has ended or never existed")));
  EXPECT_THAT(relay_.Attach("node-c", LogRelay::RequestId(request), &control),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("node-c")));
  Attach("node-a", request, &control);
  EXPECT_THAT(relay_.Attach("node-a", LogRelay::RequestId(request), &control),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("already attached")));
  EXPECT_FALSE(sink_.ended()) << "a refused attach must not end the request";
}

TEST_F(LogRelayTest, ChunkErrors) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control;
  const uint64_t a = Attach("node-a", request, &control);
  EXPECT_THAT(relay_.Chunk(a, Chunk(2, "rank 2 lives on node-b")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  ASSERT_THAT(relay_.Chunk(a, Chunk(0, "", /*eof=*/true)), IsOk());
  EXPECT_THAT(relay_.Chunk(a, Chunk(0, "after eof")),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("already ended")));
  EXPECT_THAT(relay_.Chunk(a + 100, Chunk(0, "unknown upload")),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(sink_.chunks(), ElementsAre(Pair(0, "")));
}

TEST_F(LogRelayTest, NodeThatNeverAttachesEndsTheRequestAtTheDeadline) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a;
  const uint64_t a = Attach("node-a", request, &control_a);

  clock_.Advance(kAttachTimeout - absl::Milliseconds(1));
  relay_.ExpireAttachDeadlines();
  EXPECT_FALSE(sink_.ended()) << "ended before the attach deadline";

  clock_.Advance(absl::Milliseconds(1));
  relay_.ExpireAttachDeadlines();
  ASSERT_TRUE(sink_.ended());
  EXPECT_THAT(sink_.status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("node-b"), HasSubstr("did not start uploading"))));
  // node-a still owed its ranks: its upload is cut short.
  EXPECT_EQ(control_a.aborts(), 1);
  EXPECT_THAT(control_a.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(relay_.Chunk(a, Chunk(0, "late")), StatusIs(absl::StatusCode::kCancelled));
  relay_.UploadEnded(a, absl::CancelledError("aborted"));
  EXPECT_EQ(control_a.aborts(), 1);
}

TEST_F(LogRelayTest, AttachedNodesAreNotLateAfterTheDeadline) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a, control_b;
  Attach("node-a", request, &control_a);
  Attach("node-b", request, &control_b);
  clock_.Advance(kAttachTimeout * 3);
  relay_.ExpireAttachDeadlines();
  EXPECT_FALSE(sink_.ended()) << "a follow request lasts as long as its uploads";
  EXPECT_EQ(relay_.active_requests(), 1);
}

TEST_F(LogRelayTest, UploadEndingEarlyEndsTheRequestUnavailable) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a, control_b;
  const uint64_t a = Attach("node-a", request, &control_a);
  Attach("node-b", request, &control_b);
  ASSERT_THAT(relay_.Chunk(a, Chunk(0, "", /*eof=*/true)), IsOk());

  relay_.UploadEnded(a, absl::InternalError("agent crashed"));
  ASSERT_TRUE(sink_.ended());
  EXPECT_THAT(sink_.status(), StatusIs(absl::StatusCode::kUnavailable,
                                       AllOf(HasSubstr("node node-a"), HasSubstr("rank 1"),
                                             HasSubstr("agent crashed"))));
  EXPECT_EQ(control_a.aborts(), 0) << "its call has already ended";
  EXPECT_EQ(control_b.aborts(), 1);
}

TEST_F(LogRelayTest, UploadEndingAfterItsRanksIsNotAnError) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a;
  const uint64_t a = Attach("node-a", request, &control_a);
  ASSERT_THAT(relay_.Chunk(a, Chunk(0, "", /*eof=*/true)), IsOk());
  ASSERT_THAT(relay_.Chunk(a, Chunk(1, "", /*eof=*/true)), IsOk());
  relay_.UploadEnded(a, absl::OkStatus());
  EXPECT_FALSE(sink_.ended()) << "node-b still owes rank 2";
}

TEST_F(LogRelayTest, CancelAbortsTheUploadsWithoutEndingTheSink) {
  const uint64_t request = StartTwoNodes();
  RecordingControl control_a, control_b;
  const uint64_t a = Attach("node-a", request, &control_a);
  const uint64_t b = Attach("node-b", request, &control_b);
  ASSERT_THAT(relay_.Chunk(b, Chunk(2, "", /*eof=*/true)), IsOk());

  relay_.Cancel(request);
  EXPECT_FALSE(sink_.ended()) << "the reader went away: no End";
  EXPECT_EQ(control_a.aborts(), 1);
  EXPECT_THAT(control_a.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(control_b.aborts(), 0) << "node-b had delivered its rank";
  EXPECT_THAT(relay_.Chunk(a, Chunk(0, "late")), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(relay_.active_requests(), 0);
  relay_.Cancel(request);  // Ignored.
  relay_.UploadEnded(a, absl::CancelledError("aborted"));
  EXPECT_FALSE(sink_.ended());
}

TEST_F(LogRelayTest, LostNodeEndsOnlyTheRequestsThatStillNeedIt) {
  const uint64_t waiting = StartTwoNodes();
  RecordingSink done_sink;
  const absl::StatusOr<uint64_t> done =
      relay_.Start({{"node-a", {0}}, {"node-b", {2}}}, &done_sink);
  ASSERT_THAT(done, IsOk());
  RecordingControl control;
  const uint64_t b = Attach("node-b", *done, &control);
  ASSERT_THAT(relay_.Chunk(b, Chunk(2, "", /*eof=*/true)), IsOk());
  (void)waiting;

  relay_.NodeLost("node-b");
  ASSERT_TRUE(sink_.ended());
  EXPECT_THAT(sink_.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("node node-b was lost")));
  EXPECT_FALSE(done_sink.ended()) << "node-b had delivered everything it owed that request";
  EXPECT_EQ(relay_.active_requests(), 1);
}

TEST_F(LogRelayTest, ShutdownEndsEveryRequestAndAbortsEveryUpload) {
  const uint64_t request = StartTwoNodes();
  RecordingSink other;
  const absl::StatusOr<uint64_t> finished_node =
      relay_.Start({{"node-c", {3}}, {"node-d", {4}}}, &other);
  ASSERT_THAT(finished_node, IsOk());
  RecordingControl control_a, control_c;
  Attach("node-a", request, &control_a);
  const uint64_t c = Attach("node-c", *finished_node, &control_c);
  ASSERT_THAT(relay_.Chunk(c, Chunk(3, "", /*eof=*/true)), IsOk());

  const absl::Status down = absl::UnavailableError("shutting down");
  relay_.Shutdown(down);
  EXPECT_EQ(sink_.status(), down);
  EXPECT_EQ(other.status(), down);
  // An upload still owing ranks is cut short as its request ends; one that
  // had delivered everything is aborted with the shutdown status.
  EXPECT_EQ(control_a.aborts(), 1);
  EXPECT_THAT(control_a.status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(control_c.aborts(), 1);
  EXPECT_EQ(control_c.status(), down);
  EXPECT_EQ(relay_.active_requests(), 0);

  relay_.Shutdown(down);  // Idempotent: nothing is called again.
  EXPECT_EQ(control_a.aborts(), 1);
  EXPECT_EQ(control_c.aborts(), 1);
  RecordingSink late;
  EXPECT_THAT(relay_.Start({{"node-a", {0}}}, &late), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(late.ended());
  EXPECT_THAT(late.chunks(), IsEmpty());
}

}  // namespace log_relay_test
}  // namespace mesh::coordinator
