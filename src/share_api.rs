//! The REST API's view of the SMB share table (`/api/v1/shares`).

use aquifer_rest::shares::{NewShare, ShareAdmin, ShareChange, ShareResult, ShareView};
use aquifer_smb::{ShareConfig, ShareError, SharePatch, ShareSource, ShareTable};
use storage_engine::Caller;

pub struct ShareApi(pub ShareTable);

fn view((s, source): (ShareConfig, ShareSource)) -> ShareView {
    ShareView {
        name: s.name,
        path: s.path,
        read_only: s.read_only,
        guest: s.guest,
        encrypt: s.encrypt,
        leases: s.leases,
        source: source.as_str().into(),
    }
}

fn fail(e: ShareError) -> (u16, String) {
    let status = match &e {
        ShareError::Invalid(_) => 400,
        ShareError::PermissionDenied => 403,
        ShareError::NotFound(_) => 404,
        ShareError::Conflict(_) => 409,
        ShareError::Engine(storage_engine::Error::InvalidArgument(_) | storage_engine::Error::InvalidName(_)) => 400,
        ShareError::Engine(storage_engine::Error::PermissionDenied) => 403,
        ShareError::Engine(_) => 500,
    };
    (status, e.to_string())
}

impl ShareAdmin for ShareApi {
    fn list(&self) -> Vec<ShareView> {
        self.0.list().into_iter().map(view).collect()
    }

    fn get(&self, name: &str) -> Option<ShareView> {
        self.0.get(name).map(view)
    }

    fn add(&self, caller: &Caller, n: NewShare) -> ShareResult<ShareView> {
        let s = ShareConfig { name: n.name, path: n.path, read_only: n.read_only, guest: n.guest, encrypt: n.encrypt, leases: n.leases };
        self.0.add(caller, s).map(|s| view((s, ShareSource::Api))).map_err(fail)
    }

    fn change(&self, caller: &Caller, name: &str, c: ShareChange) -> ShareResult<ShareView> {
        let patch = SharePatch { path: c.path, read_only: c.read_only, guest: c.guest, encrypt: c.encrypt, leases: c.leases };
        self.0.update(caller, name, patch).map(|s| view((s, ShareSource::Api))).map_err(fail)
    }

    fn remove(&self, caller: &Caller, name: &str) -> ShareResult<()> {
        self.0.remove(caller, name).map_err(fail)
    }
}
