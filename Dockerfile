# syntax=docker/dockerfile:1
# sigil: the release binary, stripped (Cargo profile `dist`, scripts/dist.sh), on distroless, non-root.
#   docker build -t registry.example.com/sigil:0.1.0 .
# The image runs `sigil serve` by default; `sigil-krm` is the KRM-function
# entry point (kustomize exec / kpt). Without Docker, scripts/image.sh builds
# the same image with buildah (FROM scratch with what this distroless base
# holds: glibc, libgcc_s, CA certificates, uid 65532); CI builds and runs
# that one (docs/operations.md).

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# scripts/dist.sh: the `dist` profile, packed relative relocations (glibc
# 2.36, as the Debian 12 base below has) and the start's code laid out
# together (crates/sigil/startup.order) — 10.5 MiB resident at idle, not 21.
# scripts/dist.sh --static: the node verifier, linked statically against
# musl, that the node DaemonSet copies onto hosts (any libc).
RUN apt-get update -qq && apt-get install -y -qq musl-tools >/dev/null
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_BUILD_JOBS=2 scripts/dist.sh \
 && CARGO_BUILD_JOBS=2 scripts/dist.sh --static \
 && mkdir -p /out \
 && cp target/dist/sigil /out/sigil \
 && cp target/dist/sigil-static /out/sigil-static \
 && ln -s sigil /out/sigil-krm

# glibc + libgcc only (aws-lc is linked statically), no shell, uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sigil"]
CMD ["serve"]
