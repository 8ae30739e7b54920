// HttpGet: a tiny blocking HTTP/1.0 GET over a loopback socket, for tests
// that scrape /metrics. Not a general client: no redirects, no chunked
// decoding (HTTP/1.0 asks the server not to chunk), reads until close.
//
// Errors: UNAVAILABLE if the connection fails; DEADLINE_EXCEEDED if the
// reply does not complete within `timeout`; INTERNAL for a reply without a
// status line.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mesh::testing {

struct HttpReply {
  int status = 0;
  std::string headers;
  std::string body;
};

inline absl::StatusOr<HttpReply> HttpGet(int port, const std::string& path,
                                         absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  auto wait_for = [&](short events) -> absl::Status {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("HTTP GET timed out");
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(ms));
    if (n == 0) return absl::DeadlineExceededError("HTTP GET timed out");
    if (n < 0 && errno != EINTR) return absl::UnavailableError(std::strerror(errno));
    return absl::OkStatus();
  };
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
    }
    if (absl::Status s = wait_for(POLLOUT); !s.ok()) return s;
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(err)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (absl::Status s = wait_for(POLLOUT); !s.ok()) return s;
    } else {
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
  }
  std::string raw;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (absl::Status s = wait_for(POLLIN); !s.ok()) return s;
    } else {
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
  }
  HttpReply reply;
  const size_t header_end = raw.find("\r\n\r\n");
  const size_t space = raw.find(' ');
  if (header_end == std::string::npos || space == std::string::npos ||
      !absl::SimpleAtoi(raw.substr(space + 1, 3), &reply.status)) {
    return absl::InternalError(absl::StrCat("malformed HTTP reply: ", raw.substr(0, 200)));
  }
  reply.headers = raw.substr(0, header_end);
  reply.body = raw.substr(header_end + 4);
  return reply;
}

}  // namespace mesh::testing
