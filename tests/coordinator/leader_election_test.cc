// LeaderElection (coordinator/leader_election.h) and the etcd Watch it
// sleeps on (EtcdClient::WaitForChange), against a real etcd member that
// each case starts (tests/util/etcd_cluster.h). Skipped, saying so, where
// etcd is not installed.
//
// Time bounds here are generous limits that tell "woken by the watch" from
// "waited out a timeout ten times as long", never performance targets.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/etcd_client.h"
#include "coordinator/leader_election.h"
#include "tests/util/etcd_cluster.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace {

using ::mesh::testing::EtcdCluster;
using ::mesh::testing::IsOk;
using ::mesh::testing::IsOkAndHolds;
using ::mesh::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;

constexpr char kKey[] = "/election-test/leader";

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!EtcdCluster::Available(&why)) GTEST_SKIP() << "etcd not tested: " << why;
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster = EtcdCluster::Start();
    ASSERT_THAT(cluster, IsOk());
    etcd_ = *std::move(cluster);
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
  }

  std::shared_ptr<EtcdClient> Connect() {
    EtcdClientOptions options;
    options.endpoints = etcd_->endpoints();
    options.connect_timeout = absl::Seconds(10);
    absl::StatusOr<std::shared_ptr<EtcdClient>> client = EtcdClient::Connect(options);
    EXPECT_THAT(client, IsOk());
    return client.ok() ? *client : nullptr;
  }

  std::unique_ptr<LeaderElection> Election(const std::string& address,
                                           absl::Duration ttl = absl::Seconds(30)) {
    return std::make_unique<LeaderElection>(Connect(), LeaderElectionOptions{kKey, address, ttl});
  }

  std::unique_ptr<EtcdCluster> etcd_;
  std::shared_ptr<EtcdClient> client_;
};

// Records every address on_leader reports, and signals the first
// non-empty one.
class LeaderLog {
 public:
  std::function<void(const std::string&)> Callback() {
    return [this](const std::string& leader) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(leader);
      if (!leader.empty() && !someone_leads_.HasBeenNotified()) someone_leads_.Notify();
    };
  }
  bool WaitForALeader(absl::Duration timeout) {
    return someone_leads_.WaitForNotificationWithTimeout(timeout);
  }
  std::vector<std::string> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
  absl::Notification someone_leads_;
};

TEST_F(LeaderElectionTest, WaitForChangeTimesOutWhenNothingChanges) {
  ASSERT_THAT(client_->Txn(EtcdTxn().Put(kKey, "a")), IsOk());
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(kKey);
  ASSERT_THAT(kv, IsOk());
  ASSERT_TRUE(kv->has_value());
  // A write to another key is not a change of this one.
  ASSERT_THAT(client_->Txn(EtcdTxn().Put(absl::StrCat(kKey, "-other"), "b")), IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT(client_->WaitForChange(kKey, (*kv)->mod_revision, absl::Milliseconds(300)),
              IsOkAndHolds(false));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST_F(LeaderElectionTest, WaitForChangeReportsAChangeMadeBeforeTheCall) {
  absl::StatusOr<EtcdTxnResult> put = client_->Txn(EtcdTxn().Put(kKey, "a"));
  ASSERT_THAT(put, IsOk());
  // Changed after the revision the caller read: reported at once, not
  // missed between the read and the watch.
  ASSERT_THAT(client_->Txn(EtcdTxn().Delete(kKey)), IsOk());
  const absl::Time start = absl::Now();
  EXPECT_THAT(client_->WaitForChange(kKey, put->revision, absl::Seconds(20)), IsOkAndHolds(true));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(LeaderElectionTest, WaitForChangeWakesOnAPutOrADeleteDuringTheWait) {
  for (const bool is_delete : {false, true}) {
    SCOPED_TRACE(is_delete ? "delete" : "put");
    absl::StatusOr<EtcdTxnResult> put = client_->Txn(EtcdTxn().Put(kKey, "a"));
    ASSERT_THAT(put, IsOk());
    std::thread writer([&] {
      absl::SleepFor(absl::Milliseconds(200));
      EtcdTxn txn;
      if (is_delete) {
        txn.Delete(kKey);
      } else {
        txn.Put(kKey, "b");
      }
      EXPECT_THAT(client_->Txn(txn), IsOk());
    });
    const absl::Time start = absl::Now();
    EXPECT_THAT(client_->WaitForChange(kKey, put->revision, absl::Seconds(20)), IsOkAndHolds(true));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    writer.join();
  }
}

TEST_F(LeaderElectionTest, WaitForChangeOnACompactedRevisionAsksTheCallerToReadAgain) {
  absl::StatusOr<EtcdTxnResult> first = client_->Txn(EtcdTxn().Put(kKey, "a"));
  ASSERT_THAT(first, IsOk());
  for (int i = 0; i < 3; ++i) ASSERT_THAT(client_->Txn(EtcdTxn().Put(kKey, "b")), IsOk());
  // etcdctl compaction is what an operator (or etcd's auto-compaction)
  // does; the client has no call for it, so the test uses the CLI.
  absl::StatusOr<std::optional<EtcdKeyValue>> now = client_->Get(kKey);
  ASSERT_THAT(now, IsOk());
  const std::string command =
      absl::StrCat("ETCDCTL_API=3 etcdctl --endpoints=", etcd_->endpoint_list(), " compact ",
                   (*now)->mod_revision, " >/dev/null 2>&1");
  if (std::system(command.c_str()) != 0) GTEST_SKIP() << "etcdctl compact did not run";
  EXPECT_THAT(client_->WaitForChange(kKey, first->revision - 1, absl::Seconds(20)),
              IsOkAndHolds(true));
}

TEST_F(LeaderElectionTest, AStandbyTakesOverTheMomentTheLeaderResigns) {
  std::unique_ptr<LeaderElection> a = Election("replica-a:1");
  absl::StatusOr<LeaderTerm> a_term = a->Campaign(nullptr);
  ASSERT_THAT(a_term, IsOk());
  EXPECT_FALSE(a_term->took_over) << "the first leader of an empty key takes over from no one";
  EXPECT_EQ(a->leader(), "replica-a:1");

  // A 30 s lease: only the watch can make B win within seconds of A's
  // resignation (B renews its own lease, and so looks again, every 1 s at
  // the latest; well under the bound below either way, so the bound only
  // tells a takeover from a wait for A's lease).
  std::unique_ptr<LeaderElection> b = Election("replica-b:2");
  LeaderLog log;
  absl::StatusOr<LeaderTerm> b_term;
  absl::Notification b_won;
  std::thread campaign([&] {
    b_term = b->Campaign(log.Callback());
    b_won.Notify();
  });
  ASSERT_TRUE(log.WaitForALeader(absl::Seconds(10)));
  EXPECT_EQ(b->leader(), "replica-a:1");
  EXPECT_FALSE(b_won.HasBeenNotified()) << "B won while A held the key";

  const absl::Time resigned = absl::Now();
  ASSERT_THAT(a->Resign(), IsOk());
  ASSERT_TRUE(b_won.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const absl::Duration takeover = absl::Now() - resigned;
  campaign.join();
  ASSERT_THAT(b_term, IsOk());
  EXPECT_TRUE(b_term->took_over);
  EXPECT_GT(b_term->create_revision, a_term->create_revision) << "a new term";
  EXPECT_LT(takeover, absl::Seconds(5)) << "B waited for A's 30 s lease";
  EXPECT_EQ(b->leader(), "replica-b:2");
  EXPECT_THAT(log.seen(), Contains("replica-a:1"));

  absl::StatusOr<std::optional<EtcdKeyValue>> key = client_->Get(kKey);
  ASSERT_THAT(key, IsOk());
  ASSERT_TRUE(key->has_value());
  EXPECT_EQ((*key)->value, "replica-b:2");
  EXPECT_EQ((*key)->create_revision, b_term->create_revision);
}

TEST_F(LeaderElectionTest, StopEndsACampaignWithCancelled) {
  std::unique_ptr<LeaderElection> a = Election("replica-a:1");
  ASSERT_THAT(a->Campaign(nullptr), IsOk());
  std::unique_ptr<LeaderElection> b = Election("replica-b:2");
  absl::StatusOr<LeaderTerm> b_term;
  absl::Notification done;
  std::thread campaign([&] {
    b_term = b->Campaign(nullptr);
    done.Notify();
  });
  absl::SleepFor(absl::Milliseconds(300));
  b->Stop();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  campaign.join();
  EXPECT_THAT(b_term, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(a->leader(), "replica-a:1");
}

TEST_F(LeaderElectionTest, TheLeaderLearnsItLostWhenItsLeaseIsRevokedBehindItsBack) {
  std::unique_ptr<LeaderElection> a = Election("replica-a:1", absl::Seconds(3));
  absl::StatusOr<LeaderTerm> term = a->Campaign(nullptr);
  ASSERT_THAT(term, IsOk());
  absl::Notification lost;
  std::string reason;
  a->KeepLeading([&](const std::string& why) {
    reason = why;
    lost.Notify();
  });
  // As etcd does when the lease expires (a pause longer than the TTL).
  ASSERT_THAT(client_->LeaseRevoke(term->lease), IsOk());
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Revoking the lease deletes the key: the renewal sees one or the other.
  EXPECT_THAT(reason, AnyOf(HasSubstr("lease expired"), HasSubstr("key was deleted")));
  EXPECT_EQ(a->leader(), "");
  a->Stop();
}

TEST_F(LeaderElectionTest, ALossBeforeKeepLeadingIsReportedByIt) {
  // Renewals start when Campaign wins, before the caller (the coordinator,
  // reading its store) gets to KeepLeading.
  std::unique_ptr<LeaderElection> a = Election("replica-a:1", absl::Seconds(3));
  absl::StatusOr<LeaderTerm> term = a->Campaign(nullptr);
  ASSERT_THAT(term, IsOk());
  ASSERT_THAT(client_->LeaseRevoke(term->lease), IsOk());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!a->leader().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(a->leader(), "") << "the renewal did not notice the revoked lease";
  std::string reason;
  a->KeepLeading([&](const std::string& why) { reason = why; });
  EXPECT_THAT(reason, AnyOf(HasSubstr("lease expired"), HasSubstr("key was deleted")))
      << "reported at once, on the caller's thread";
}

TEST_F(LeaderElectionTest, ResigningReportsNoLossAndFreesTheKey) {
  std::unique_ptr<LeaderElection> a = Election("replica-a:1", absl::Seconds(3));
  ASSERT_THAT(a->Campaign(nullptr), IsOk());
  std::atomic<int> losses{0};
  a->KeepLeading([&](const std::string&) { ++losses; });
  ASSERT_THAT(a->Resign(), IsOk());
  absl::SleepFor(absl::Milliseconds(1500));  // Past a renewal period.
  EXPECT_EQ(losses.load(), 0);
  absl::StatusOr<std::optional<EtcdKeyValue>> key = client_->Get(kKey);
  ASSERT_THAT(key, IsOk());
  EXPECT_FALSE(key->has_value());
}

}  // namespace
}  // namespace mesh::coordinator
