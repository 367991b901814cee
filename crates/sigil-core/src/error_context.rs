//! The one way sigil's crates name the operation an error came from while
//! keeping it typed: [`error_context!`](crate::error_context!) writes a crate's
//! `Context` trait (`.context("reading X")`, `.with_context(|| ...)`) for the
//! source errors its error enum wraps, each into its `{ context, source }`
//! variant. Only a macro lives here; no I/O.

/// Defines `pub trait Context<T>` for `$error`, implemented for
/// `Result<T, $source>` of each `$source => $variant` pair (a `box` variant
/// stores the source boxed), turning the source into
/// `$error::$variant { context, source }`.
#[macro_export]
macro_rules! error_context {
    ($error:ident: $($source:ty => $variant:ident $($boxed:ident)?),+ $(,)?) => {
        /// Names the operation an error came from, keeping the error typed.
        pub trait Context<T> {
            /// Wraps the error with `context`.
            fn context(self, context: impl Into<String>) -> ::std::result::Result<T, $error>;
            /// Wraps the error with the context `f` builds (only on failure).
            fn with_context<S: Into<String>>(
                self,
                f: impl FnOnce() -> S,
            ) -> ::std::result::Result<T, $error>;
        }
        $(
            impl<T> Context<T> for ::std::result::Result<T, $source> {
                fn context(self, context: impl Into<String>) -> ::std::result::Result<T, $error> {
                    self.map_err(|source| $error::$variant {
                        context: context.into(),
                        source: $crate::error_context!(@wrap source $($boxed)?),
                    })
                }
                fn with_context<S: Into<String>>(
                    self,
                    f: impl FnOnce() -> S,
                ) -> ::std::result::Result<T, $error> {
                    self.map_err(|source| $error::$variant {
                        context: f().into(),
                        source: $crate::error_context!(@wrap source $($boxed)?),
                    })
                }
            }
        )+
    };
    (@wrap $s:ident box) => {
        Box::new($s)
    };
    (@wrap $s:ident) => {
        $s
    };
}
