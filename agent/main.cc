// mesh-agent: see agent/agent_main.h and docs/agent.md.
#include "agent/agent_main.h"

int main(int argc, char** argv) { return mesh::agent::RunAgentMain(argc, argv); }
