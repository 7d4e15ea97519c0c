# syntax=docker/dockerfile:1
# A derived image that adds an agent CLI to the hosted-boot base image.
#   docker build -t hosted-boot .
#   docker build -f image/agent-cli.Dockerfile -t hosted-boot-claude .
ARG BASE=hosted-boot:latest
FROM ${BASE}
# The version the suite tests (tools/agent-clis/package.json, checked by
# tests/suite/image.rs; the image tests run this image): `latest` takes the
# newest, untested.
ARG CLAUDE_CODE_VERSION=2.1.197
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008,DL3016
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && npm install --global --no-fund --no-audit "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" \
 && npm cache clean --force \
 && rm -rf /var/lib/apt/lists/*
# The runner stays root; the agent runs as `agent` (HOSTED_BOOT_AGENT_USER
# of the base image).
ENV HOSTED_BOOT_AGENT=claude
