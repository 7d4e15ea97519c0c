# syntax=docker/dockerfile:1
# The sandbox image: hosted-boot as the entrypoint, git, CA certificates,
# an unprivileged `agent` user. The runner runs as root and every process of
# the agent as `agent` (HOSTED_BOOT_AGENT_USER); image/README.md shows the
# non-root variant. Agent CLIs are not baked in: add them with the
# AGENT_NPM_PACKAGES build argument or a derived image (image/README.md).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
# Unset, the release profile of Cargo.toml (fat LTO, one codegen unit). CI
# passes `false` (scripts/image --no-lto): the binary's step took 83 s
# instead of 138 s on a 2-core machine (BENCHMARKS.md, "The image"). Cargo
# reads it from the environment, where a build argument is for the RUN
# steps below.
ARG CARGO_PROFILE_RELEASE_LTO
# Dependencies first, in a layer of their own that survives source edits:
# every target the manifests declare (the lib, the bin, the benches, each
# workspace crate's lib) gets an empty stand-in, removed after the build
# (with what cargo built of them: every hosted-boot* and hosted_boot* artifact). scripts/check-dockerfile (CI)
# replays both steps without an engine.
COPY Cargo.toml Cargo.lock ./
# Each crate of the workspace: its manifest here, its sources below.
COPY crates/wire/Cargo.toml crates/wire/Cargo.toml
COPY crates/coordinator/Cargo.toml crates/coordinator/Cargo.toml
COPY crates/redact/Cargo.toml crates/redact/Cargo.toml
COPY crates/conformance/Cargo.toml crates/conformance/Cargo.toml
COPY crates/test-support/Cargo.toml crates/test-support/Cargo.toml
COPY image/stub-targets /usr/local/bin/stub-targets
RUN stub-targets > /tmp/stubs \
 && cargo build --release --locked \
 && xargs rm -f < /tmp/stubs \
 && rm -rf /tmp/stubs target/release/.fingerprint/hosted-boot* \
           target/release/deps/hosted_boot* target/release/deps/libhosted_boot*
# The libs and the bins are all this build needs (the benches' paths are
# explicit in Cargo.toml, so cargo does not look for their files), the
# files their code includes (`include_str!`): the OpenAPI document, which
# only the conformance checker embeds, and the runner's build script with
# its link order (build.rs, link/symbol-order.txt).
COPY src ./src
COPY crates ./crates
COPY docs/openapi.yaml ./docs/openapi.yaml
COPY build.rs ./build.rs
COPY link ./link
COPY image/link-order ./image/link-order
# The link order's names hash the toolchain and the profile (build.rs): the
# log says how many of them this build linked in order (all but a few with
# the release profile and Rust 1.95.0; few with CARGO_PROFILE_RELEASE_LTO=false
# or another toolchain, which costs resident memory, not correctness).
RUN cargo build --release --locked --bin hosted-boot \
 && sh image/link-order target/release/hosted-boot link/symbol-order.txt \
 && install -s -m 0755 target/release/hosted-boot /usr/local/bin/hosted-boot

# The other two binaries, in a stage of their own: a build of the sandbox
# image (the default target) does not link them (BuildKit builds only the
# stages a target needs).
FROM build AS build-tools
RUN cargo build --release --locked --bin hosted-boot-coordinator --bin hosted-boot-conformance \
 && install -s -m 0755 target/release/hosted-boot-coordinator /usr/local/bin/hosted-boot-coordinator \
 && install -s -m 0755 target/release/hosted-boot-conformance /usr/local/bin/hosted-boot-conformance

# The conformance checker alone (README, "For platform implementers"), to
# copy into a platform's own sandbox image beside the runner, or out of the
# build: `docker build --target conformance --output type=local,dest=. .`.
FROM scratch AS conformance
COPY --from=build-tools /usr/local/bin/hosted-boot-conformance /hosted-boot-conformance

# The reference coordinator, for local debugging beside a sandbox
# (image/docker-compose.yml): `docker build --target coordinator`. Not in
# the sandbox image, which carries the runner alone (the last stage, the
# default target).
FROM debian:${DEBIAN_RELEASE}-slim AS coordinator
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-tools /usr/local/bin/hosted-boot-coordinator /usr/local/bin/hosted-boot-coordinator
WORKDIR /srv
ENTRYPOINT ["/usr/local/bin/hosted-boot-coordinator"]
CMD ["serve", "--listen=0.0.0.0:8787"]

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG VERSION=0.1.0
# Space-separated npm packages of agent CLIs to install (with Debian's
# nodejs and npm), e.g. "@anthropic-ai/claude-code". Empty: none.
ARG AGENT_NPM_PACKAGES=""
LABEL org.opencontainers.image.title="hosted-boot" \
      org.opencontainers.image.description="Entrypoint of a cloud sandbox in which an AI coding agent works on a user's repository" \
      org.opencontainers.image.source="https://github.com/hosted-boot/hosted-boot" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008,DL3016
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates \
 && if [ -n "${AGENT_NPM_PACKAGES}" ]; then \
      apt-get install -y --no-install-recommends nodejs npm \
      && npm install --global --no-fund --no-audit ${AGENT_NPM_PACKAGES} \
      && npm cache clean --force; \
    fi \
 && rm -rf /var/lib/apt/lists/*

# /workspace is the runner's (root, 0755); the runner gives repo/ to
# `agent` and keeps the session directory to itself (0711).
RUN useradd --uid 1000 --user-group --create-home --shell /bin/bash agent \
 && install -d -m 0755 -o root -g root /workspace
COPY image/gitconfig /etc/gitconfig
COPY --from=build /usr/local/bin/hosted-boot /usr/local/bin/hosted-boot

ENV HOSTED_BOOT_ROOT=/workspace \
    HOSTED_BOOT_AGENT_USER=agent
WORKDIR /workspace
# No USER: the runner stays root so that the agent, as `agent`, can read
# neither the runner's files nor its memory; for runAsNonRoot (runner and
# agent one uid, HOSTED_BOOT_AGENT_USER empty) see image/README.md.
STOPSIGNAL SIGTERM
# Unhealthy when the runner is gone or stuck (its status file not rewritten
# for 2 min); a coordinator outage alone is not unhealthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/hosted-boot", "status", "--check"]
ENTRYPOINT ["/usr/local/bin/hosted-boot"]
CMD ["run"]
