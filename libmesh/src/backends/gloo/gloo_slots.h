// The gloo slot prefixes libmesh's own Gloo traffic uses (internal).
//
// gloo matches a message to a receive by (peer, slot), and its own
// collectives build their slots with prefixes 0x01..0x08. Every stream of
// ours gets a prefix of its own here, in one place, so that no two can ever
// match each other's messages (a user's Recv catching a ring's segment, say).
#pragma once

#include <cstdint>

namespace mesh::gloo_backend {

inline constexpr uint8_t kReduceScatterSlotPrefix = 0x20;  // gloo_ring: reduce-scatter.
inline constexpr uint8_t kSendRecvSlotPrefix = 0x21;       // ProcessGroupGloo::Send/Recv.
inline constexpr uint8_t kAllGatherSlotPrefix = 0x22;      // gloo_ring: all-gather.

}  // namespace mesh::gloo_backend
