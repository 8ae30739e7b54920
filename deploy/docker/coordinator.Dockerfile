# mesh-coordinator image (docs/deploy.md, "Docker"). Build from the repo root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t mesh-coordinator .
#
# Stage 1 builds with Debian's packages (scripts/install-deps.sh), as CI does;
# stage 2 carries the two binaries and only the shared libraries they load.
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESH_BUILD_TESTS=OFF \
      -DMESH_WITH_CUDA=OFF \
    && cmake --build /build --target mesh-coordinator meshctl \
    && strip --strip-debug /build/coordinator/mesh-coordinator /build/cli/meshctl

FROM debian:bookworm-slim AS runtime
# The runtime halves of the -dev packages the binaries link (ldd of both).
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      ca-certificates libgrpc++1.51 libprotobuf32 libabsl20220623 libsqlite3-0 \
      libspdlog1.10 libfmt9 libyaml-cpp0.7 libsystemd0 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/coordinator/mesh-coordinator /build/cli/meshctl /usr/local/bin/
# Fixed uid/gid so that volumes and Kubernetes fsGroup can name them.
RUN groupadd --system --gid 10001 mesh \
    && useradd --system --uid 10001 --gid mesh --home-dir /var/lib/mesh --shell /usr/sbin/nologin mesh \
    && mkdir -p /var/lib/mesh/state /var/lib/mesh/prometheus \
    && chown -R mesh:mesh /var/lib/mesh && chmod 0700 /var/lib/mesh/state
USER 10001:10001
# state: the job database (mount a volume); prometheus: the --sd-file
# targets, shared with Prometheus.
VOLUME ["/var/lib/mesh/state", "/var/lib/mesh/prometheus"]
EXPOSE 7450 9400
# A real grpc.health.v1 call with a deadline. The TLS settings come from the
# environment (MESH_TLS_CA, MESH_TLS_CERT, MESH_TLS_KEY, MESH_TLS_SERVER_NAME,
# MESH_TOKEN_FILE), as set by compose or Kubernetes.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["meshctl", "--coordinator", "127.0.0.1:7450", "--timeout", "3", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["mesh-coordinator"]
# No default that serves plaintext: without --tls-cert/--tls-key (or
# --insecure) the coordinator refuses to start. See deploy/compose.
CMD ["--listen", "0.0.0.0", "--port", "7450", "--state-dir", "/var/lib/mesh/state", \
     "--metrics-port", "9400", "--sd-file", "/var/lib/mesh/prometheus/targets.json"]
