// mesh-agent's main, as a function so tests can run its flag handling
// in-process: flags -> AgentConfig -> Agent, until SIGINT or SIGTERM.
//
// Exit codes: 0 after a signal-triggered shutdown (or --help, --version,
// --discover); 1 when the agent cannot start; 2 for a usage error (bad
// flag, bad value, bad config file).
//
// Precedence: flag, then environment (MESH_COORDINATOR, MESH_AGENT_*), then
// --config file, then defaults (common/flags.h). docs/agent.md lists them.
//
// Thread safety: call once, from main(), before any thread exists: it forks
// the reaper watchdog (agent/reaper_watchdog.h) before starting threads.
// Usage errors and --discover return before anything is forked or started.
#pragma once

namespace mesh::agent {

inline constexpr int kAgentExitOk = 0;
inline constexpr int kAgentExitFailed = 1;
inline constexpr int kAgentExitUsage = 2;

int RunAgentMain(int argc, const char* const* argv);

}  // namespace mesh::agent
