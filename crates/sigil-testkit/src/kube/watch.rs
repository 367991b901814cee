//! The stand-in's watches: events after a resourceVersion as
//! newline-delimited JSON, BOOKMARKs, `timeoutSeconds`, selectors, and an
//! ERROR event carrying 410 Gone for a resourceVersion older than the last
//! compaction, so kube-runtime's watcher must relist as it would against
//! kube-apiserver.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::Body;
use super::route::{fields_match, in_collection, labels_match, query_param};
use super::store::State;

/// Longest a watch stays open (the API server's own limit is minutes;
/// clients reconnect from the last resourceVersion either way).
const WATCH_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// How often an idle watch gets a BOOKMARK.
const BOOKMARK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// A `?watch=true` request: events after `resourceVersion`, as
/// newline-delimited JSON, until `timeoutSeconds` (at most [`WATCH_MAX`]).
pub(super) fn watch(
    st: Arc<Mutex<State>>,
    coll: String,
    resource: String,
    query: &str,
) -> hyper::Response<Body> {
    let from: Option<u64> = query_param(query, "resourceVersion")
        .filter(|r| !r.is_empty() && r != "0")
        .and_then(|r| r.parse().ok());
    let bookmarks = query_param(query, "allowWatchBookmarks").as_deref() == Some("true");
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(std::time::Duration::from_secs)
        .unwrap_or(WATCH_MAX)
        .min(WATCH_MAX);
    let labels = query_param(query, "labelSelector");
    let fields = query_param(query, "fieldSelector");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, Infallible>>(64);
    let line = |v: Value| Ok(hyper::body::Frame::data(Bytes::from(format!("{v}\n"))));
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + timeout;
        let (changed, mut cursor, gone) = {
            let s = st.lock().unwrap();
            let gone = from.is_some_and(|rv| rv < s.compacted);
            (s.changed.clone(), from.unwrap_or(0), gone)
        };
        if gone {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {cursor} (compacted)"), "reason": "Expired", "code": 410});
            let _ = tx
                .send(line(json!({"type": "ERROR", "object": status})))
                .await;
            return;
        }
        if from.is_none() {
            // No resourceVersion: existing objects first, as synthetic ADDED events.
            let (items, rv) = {
                let s = st.lock().unwrap();
                let items = s.list(&coll);
                (items, s.rv)
            };
            for o in items {
                if labels_match(&o, labels.as_deref())
                    && fields_match(&o, fields.as_deref())
                    && tx
                        .send(line(json!({"type": "ADDED", "object": o})))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            cursor = rv;
        }
        let mut last_sent = tokio::time::Instant::now();
        loop {
            let notified = changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (batch, rv) = {
                let s = st.lock().unwrap();
                let batch: Vec<(u64, &'static str, Value)> = s
                    .events
                    .iter()
                    .filter(|(rv, c, _, o)| {
                        *rv > cursor
                            && in_collection(&coll, c)
                            && labels_match(o, labels.as_deref())
                            && fields_match(o, fields.as_deref())
                    })
                    .map(|(rv, _, t, o)| (*rv, *t, o.clone()))
                    .collect();
                (batch, s.rv)
            };
            for (erv, t, o) in batch {
                if tx
                    .send(line(json!({"type": t, "object": o})))
                    .await
                    .is_err()
                {
                    return;
                }
                cursor = cursor.max(erv);
                last_sent = tokio::time::Instant::now();
            }
            let now = tokio::time::Instant::now();
            if now >= until {
                return;
            }
            if bookmarks && now.duration_since(last_sent) >= BOOKMARK_EVERY {
                let kind = st.lock().unwrap().kind_of(&resource);
                let b = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                    "metadata": {"resourceVersion": rv.to_string()}}});
                if tx.send(line(b)).await.is_err() {
                    return;
                }
                cursor = cursor.max(rv);
                last_sent = now;
            }
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(until.min(now + BOOKMARK_EVERY)) => {}
            }
        }
    });
    let stream = tokio_stream_from(rx);
    hyper::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(http_body_util::StreamBody::new(stream).boxed())
        .unwrap()
}

/// An mpsc receiver as a `Stream` (what `StreamBody` wants).
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
