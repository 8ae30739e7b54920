# etcd for deploy/compose/compose.ha.yaml (docs/ha.md): Debian bookworm's
# etcd-server and etcd-client (etcdctl, for the HEALTHCHECK and for
# `etcdctl snapshot save`), 3.4.23, the version docs/ha.md was tested with.
# Nothing is compiled, so one stage. The package creates the system user
# etcd and /var/lib/etcd (0700, owned by it), where compose mounts the
# member's volume.
#
#   docker build -f deploy/compose/etcd.Dockerfile -t mesh-etcd .
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/*
USER etcd
WORKDIR /var/lib/etcd
EXPOSE 2379 2380
# Healthy when this member answers and the cluster has a leader (a quorum).
# compose.ha.yaml points ETCDCTL_ENDPOINTS and ETCDCTL_CACERT/CERT/KEY at
# the member's TLS listener.
ENV ETCDCTL_API=3 ETCDCTL_ENDPOINTS=http://127.0.0.1:2379
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["etcdctl", "endpoint", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["etcd"]
