// Small pieces every RPC adapter of the coordinator shares (the services'
// *_service.cc): how long a waiting call may wait, and finishing a unary
// reactor with an absl::Status.
//
// Thread safety: stateless functions; safe from any thread.
#pragma once

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

// How long a waiting call may wait: the smaller of the request's own
// `timeout_seconds` (unset when <= 0) and what is left until the client's
// `deadline` (time_point::max() when the client set none), seen at `now`.
// Zero when neither is set: the logic class then applies its default. A
// deadline that has already passed gives 1 ns, never zero, so that it
// cannot turn into "the server default" and wait minutes for a client that
// has given up.
absl::Duration EffectiveTimeout(std::chrono::system_clock::time_point deadline,
                                double timeout_seconds, std::chrono::system_clock::time_point now);

// EffectiveTimeout for a call being served, at the current time.
absl::Duration EffectiveTimeout(const grpc::CallbackServerContext* ctx, double timeout_seconds);

// Finishes the call's default unary reactor with `status` and returns it.
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx, const absl::Status& status);

}  // namespace mesh::coordinator
