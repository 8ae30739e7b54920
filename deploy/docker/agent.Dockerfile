# mesh-agent image (docs/deploy.md, "Docker"). Build from the repo root:
#   docker build -f deploy/docker/agent.Dockerfile -t mesh-agent .
#
# Base: debian:bookworm-slim, not nvidia/cuda. The binaries link Debian
# bookworm's gRPC 1.51, Abseil 20220623 and protobuf 3.21; NVIDIA publishes
# no Debian-based CUDA image, and its Ubuntu 24.04 images carry those
# libraries under other ABIs (the t64 transition), so running a bookworm build
# there would be a mismatch. The agent itself needs no CUDA: it dlopens NVML
# (libnvidia-ml.so.1), and the NVIDIA Container Toolkit mounts that and
# libcuda from the host driver into any image that sets
# NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES (below). Workers run
# inside this container, as the agent's children: build your job image FROM
# this one and add your runtime (Python, PyTorch wheels bring their own CUDA
# runtime and NCCL).
FROM debian:bookworm AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESH_BUILD_TESTS=OFF \
      -DMESH_WITH_CUDA=OFF \
    && cmake --build /build --target mesh-agent meshctl \
    && strip --strip-debug /build/agent/mesh-agent /build/cli/meshctl

FROM debian:bookworm-slim AS runtime
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      ca-certificates libgrpc++1.51 libprotobuf32 libabsl20220623 \
      libspdlog1.10 libfmt9 libyaml-cpp0.7 libsystemd0 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /build/agent/mesh-agent /build/cli/meshctl /usr/local/bin/
RUN groupadd --system --gid 10001 mesh \
    && useradd --system --uid 10001 --gid mesh --home-dir /var/lib/mesh --shell /usr/sbin/nologin mesh \
    && mkdir -p /var/lib/mesh/agent && chown -R mesh:mesh /var/lib/mesh \
    && chmod 0700 /var/lib/mesh/agent
# compute: libcuda; utility: NVML (GPU discovery in the agent).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Non-root by default: every worker then runs as uid 10001 and the agent
# says job isolation is off (compose runs it so). Job isolation needs the
# agent as root with a few capabilities and the node's cgroups, which the
# Kubernetes DaemonSet grants (deploy/k8s/agent-daemonset.yaml).
USER 10001:10001
# Per-rank logs; a volume so that `meshctl logs` survives a container restart.
VOLUME ["/var/lib/mesh/agent"]
EXPOSE 9401
# The agent serves no gRPC; its /metrics (the exporter thread) answering
# with mesh_build_info is the liveness signal. Bash's /dev/tcp: the slim
# image has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9401 && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q mesh_build_info <&3"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["mesh-agent"]
CMD ["--work-dir", "/var/lib/mesh/agent", "--metrics-port", "9401", \
     "--metrics-listen", "0.0.0.0"]
