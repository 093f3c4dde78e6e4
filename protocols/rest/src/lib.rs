//! Aquifer's REST API: the admin API (`/api/v1/...`) and the REST file API
//! (`/api/v1/files/...`, `/api/v1/dirs/...`), served with axum on hyper (DESIGN.md §4).
//!
//! This crate is a thin adapter: it parses HTTP, authenticates the caller, calls the storage
//! engine (a blocking API, always through `spawn_blocking`) and encodes the answer. Permission
//! checks on files happen in the engine; admin resources that the engine serves without a
//! caller (drives, pools, jobs, health) are guarded here by role.
//!
//! Wire types live in [`wire`]; engine types never derive serde.

mod admin;
mod auth;
pub mod chroots;
mod error;
pub mod exports;
mod extract;
mod files;
mod openapi;
mod paths;
pub mod portals;
mod server;
pub mod shares;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, on};
use storage_engine::Engine;

pub use error::ApiError;
pub use server::{BODY_IDLE_TIMEOUT_MS, CONNECTIONS_MAX, HEADER_READ_TIMEOUT_MS, ServeOptions, serve, serve_hooks, serve_opts, serve_with};

/// Largest JSON request body. File uploads stream and are not bound by it.
pub const JSON_BODY_BYTES_MAX: usize = 1 << 20;

/// Everything a handler needs.
#[derive(Clone)]
pub(crate) struct AppState {
    pub engine: Arc<Engine>,
    pub portals: Option<Arc<dyn portals::PortalAdmin>>,
    pub exports: Option<Arc<dyn exports::ExportAdmin>>,
    pub shares: Option<Arc<dyn shares::ShareAdmin>>,
}

/// The services the daemon runs beside the API that some routes administer; a route whose
/// service is missing answers 503.
#[derive(Clone, Default)]
pub struct Hooks {
    pub portals: Option<Arc<dyn portals::PortalAdmin>>,
    pub exports: Option<Arc<dyn exports::ExportAdmin>>,
    pub shares: Option<Arc<dyn shares::ShareAdmin>>,
}

/// Builds the router and records every (method, path) it serves, so that the OpenAPI document
/// can be checked against what is really routed.
struct Routes {
    router: Router<AppState>,
    served: Vec<(Method, &'static str)>,
}

impl Routes {
    fn on<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("standard HTTP method");
        self.router = self.router.route(path, on(filter, handler));
        self.served.push((method, path));
        self
    }
}

fn routes() -> Routes {
    let r = Routes { router: Router::new(), served: Vec::new() };
    let r = admin::routes(r);
    let r = files::routes(r);
    let r = portals::routes(r);
    let r = exports::routes(r);
    let r = shares::routes(r);
    let r = chroots::routes(r);
    r.on(Method::GET, "/api/v1/openapi.json", openapi::get_openapi)
}

/// Every route the API serves as (method, path in OpenAPI form, e.g. `/api/v1/files/{path}`).
pub fn served_routes() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> =
        routes().served.iter().map(|(m, p)| (m.as_str().to_string(), openapi::openapi_path(p))).collect();
    v.sort();
    v
}

/// The complete API as an axum router (also used by tests that drive it in-process).
pub fn router(engine: Arc<Engine>) -> Router {
    router_with(engine, None)
}

/// The API with the fabric's portal administration behind `/api/v1/portals`.
pub fn router_with(engine: Arc<Engine>, portals: Option<Arc<dyn portals::PortalAdmin>>) -> Router {
    router_hooks(engine, Hooks { portals, ..Hooks::default() })
}

/// The API with every administered service the daemon runs.
pub fn router_hooks(engine: Arc<Engine>, hooks: Hooks) -> Router {
    routes()
        .router
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(DefaultBodyLimit::max(JSON_BODY_BYTES_MAX))
        .with_state(AppState { engine, portals: hooks.portals, exports: hooks.exports, shares: hooks.shares })
}
