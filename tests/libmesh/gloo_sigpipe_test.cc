// A dead peer must fail ops with UNAVAILABLE, not kill the survivors: the
// Gloo factory ignores SIGPIPE when it still has its default action.
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <memory>

#include <gtest/gtest.h>

#include "mesh/in_memory_store.h"
#include "mesh/process_group_gloo.h"

namespace mesh {
namespace gloo_sigpipe_test {

TEST(GlooSigpipe, FactoryIgnoresSigpipeWhenItHasItsDefaultAction) {
  ASSERT_NE(signal(SIGPIPE, SIG_DFL), SIG_ERR);
  GlooOptions options;
  options.hostname = "127.0.0.1";
  auto factory = GlooProcessGroupFactory::Create(std::make_shared<InMemoryStore>(), 0, 1, options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  struct sigaction current {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
  // And a write to a closed pipe now fails with EPIPE instead of killing us.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  EXPECT_EQ(write(fds[1], "x", 1), -1);
  EXPECT_EQ(errno, EPIPE);
  close(fds[1]);
}

}  // namespace gloo_sigpipe_test
}  // namespace mesh
