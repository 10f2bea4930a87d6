# One image for every service of docker-compose.yml: the coordinator, the agents and the
# one-shot certificate service. iproute2 brings `tc` for the agents' netem-shaped links.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*

# A CPU build of torch keeps the image small; pass --build-arg TORCH_SPEC=... (and
# PIP_INDEX_URL/PIP_EXTRA_INDEX_URL) to pick another build.
ARG TORCH_SPEC="torch>=2.4"
RUN pip install --no-cache-dir "${TORCH_SPEC}"

WORKDIR /src
COPY . .
RUN pip install --no-cache-dir .

WORKDIR /work
CMD ["coordinator", "--help"]
