# One image for every service of docker-compose.yml: the coordinator, the agents and the
# one-shot certificate service. iproute2 brings `ip` and `tc` for the agents' netem-shaped
# links. Every service runs as the unprivileged user `skyfed`. The agents shape their
# links with copies of `ip` and `tc` in /opt/netadmin that carry the file capability
# CAP_NET_ADMIN (first on the agents' PATH in docker-compose.yml); it takes effect only in
# a container granted that capability (the agents' `cap_add: [NET_ADMIN]`). The plain
# binaries stay as they were, so the other services can run them.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends iproute2 libcap2-bin \
    && mkdir -p /opt/netadmin \
    && cp "$(command -v ip)" "$(command -v tc)" /opt/netadmin/ \
    && setcap cap_net_admin+ep /opt/netadmin/ip \
    && setcap cap_net_admin+ep /opt/netadmin/tc \
    && rm -rf /var/lib/apt/lists/*

# The versions CI passed with (constraints.txt, written by .ci/lock). A CPU build of
# torch keeps the image small: pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (or another index) to pick the build of the pinned version.
ARG TORCH_INDEX=""
WORKDIR /src
COPY constraints.txt .
RUN pip install --no-cache-dir ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} \
    "torch==$(sed -n 's/^torch==//p' constraints.txt)"

COPY . .
RUN pip install --no-cache-dir -c constraints.txt .

# The volumes' mount points, owned by the user: a new named volume takes their owner.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin skyfed \
    && mkdir -p /pki /certs /checkpoints /work \
    && chown skyfed:skyfed /pki /checkpoints /work
USER 10001:10001

WORKDIR /work
CMD ["coordinator", "--help"]
