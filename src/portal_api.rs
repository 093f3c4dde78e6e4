//! The daemon's fabric settings and the REST API's view of it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use aquifer_rest::portals::{BoxFuture, PortalAdmin, PortalResult};
use fabric::{CreatePortal, Fabric, FabricConfig};
use serde::Deserialize;
use serde_json::{Value, json};
use storage_engine::Caller;

/// `[fabric]` in the configuration file.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct FabricEntry {
    pub listen: Option<SocketAddr>,
    pub region: Option<String>,
    pub name: Option<String>,
    pub lease_ms: Option<u64>,
    pub cache_bytes_max: Option<u64>,
    pub free_percent_min: Option<u8>,
    pub connections_max: Option<usize>,
}

/// The default fabric listener of the embedded single node.
pub const FABRIC_LISTEN_DEFAULT: &str = "127.0.0.1:7700";

pub fn config(data_dir: &Path, file: &FabricEntry, listen: Option<SocketAddr>, region: Option<String>, name: Option<String>) -> FabricConfig {
    FabricConfig {
        listen: Some(listen.or(file.listen).unwrap_or_else(|| FABRIC_LISTEN_DEFAULT.parse().expect("address"))),
        listen_required: listen.is_some() || file.listen.is_some(),
        region: region.or(file.region.clone()).unwrap_or_else(|| "local".into()),
        name: name.or(file.name.clone()).unwrap_or_else(|| {
            std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()).unwrap_or_else(|_| "aquifer".into())
        }),
        identity_dir: data_dir.join("fabric"),
        lease_ms: file.lease_ms.unwrap_or(fabric::LEASE_MS_DEFAULT),
        cache_bytes_max: file.cache_bytes_max.unwrap_or(u64::MAX),
        free_percent_min: file.free_percent_min.unwrap_or(10),
        connections_max: file.connections_max.unwrap_or(fabric::CONNECTIONS_MAX_DEFAULT),
    }
}

pub struct PortalApi(pub Arc<Fabric>);

fn fail(e: fabric::ApiFailure) -> (u16, String) {
    (e.status, e.message)
}

impl PortalAdmin for PortalApi {
    fn identity(&self) -> Value {
        json!({
            "fingerprint": self.0.fingerprint(),
            "region": self.0.region(),
            "listen": self.0.local_addr().map(|a| a.to_string()),
        })
    }

    fn list(&self) -> Vec<Value> {
        self.0.records().unwrap_or_default().iter().map(|r| self.0.describe(r)).collect()
    }

    fn get(&self, id: &str) -> Option<Value> {
        self.0.record(id).map(|r| self.0.describe(&r))
    }

    fn create(&self, caller: Caller, body: Value) -> BoxFuture<PortalResult> {
        let f = self.0.clone();
        Box::pin(async move {
            let req: CreatePortal = serde_json::from_value(body).map_err(|e| (400, format!("invalid portal request: {e}")))?;
            let r = f.create(&caller, req).await.map_err(fail)?;
            Ok(f.describe(&r))
        })
    }

    fn authorize(&self, caller: Caller, id: String) -> PortalResult {
        let r = self.0.authorize(&caller, &id).map_err(fail)?;
        Ok(self.0.describe(&r))
    }

    fn delete(&self, caller: Caller, id: String) -> BoxFuture<PortalResult> {
        let f = self.0.clone();
        Box::pin(async move {
            f.delete(&caller, &id).await.map_err(fail)?;
            Ok(Value::Null)
        })
    }

    fn patch(&self, caller: Caller, id: String, body: Value) -> PortalResult {
        let Some(on) = body.get("serve_stale").and_then(Value::as_bool) else {
            return Err((400, "give {\"serve_stale\": true|false}".into()));
        };
        let r = self.0.set_serve_stale(&caller, &id, on).map_err(fail)?;
        Ok(self.0.describe(&r))
    }
}
