//! The REST API's view of the NFS export table (`/api/v1/exports`).

use aquifer_nfs::{Export, ExportError, ExportInfo, ExportPatch, ExportSource, ExportTable};
use aquifer_rest::exports::{ExportAdmin, ExportChange, ExportResult, ExportView, NewExport};
use storage_engine::Caller;

pub struct ExportApi(pub ExportTable);

fn view(i: ExportInfo) -> ExportView {
    ExportView {
        id: i.id,
        path: i.export.path,
        clients: i.export.clients,
        read_only: i.export.read_only,
        root_squash: i.export.root_squash,
        source: match i.source {
            ExportSource::Config => "config",
            ExportSource::Api => "api",
        }
        .into(),
    }
}

fn fail(e: ExportError) -> (u16, String) {
    let status = match &e {
        ExportError::Invalid(_) => 400,
        ExportError::PermissionDenied => 403,
        ExportError::NotFound(_) => 404,
        ExportError::Conflict(_) => 409,
        ExportError::Engine(storage_engine::Error::NotFound) => 404,
        ExportError::Engine(storage_engine::Error::NotDir) => 400,
        ExportError::Engine(storage_engine::Error::InvalidArgument(_) | storage_engine::Error::InvalidName(_)) => 400,
        ExportError::Engine(_) => 500,
    };
    let message = match e {
        ExportError::Engine(storage_engine::Error::NotFound) => "the export's directory does not exist".to_string(),
        other => other.to_string(),
    };
    (status, message)
}

impl ExportAdmin for ExportApi {
    fn list(&self) -> Vec<ExportView> {
        self.0.list().into_iter().map(view).collect()
    }

    fn get(&self, id: &str) -> Option<ExportView> {
        self.0.get(id).map(view)
    }

    fn add(&self, caller: &Caller, new: NewExport) -> ExportResult<ExportView> {
        let e = Export { path: new.path, clients: new.clients, read_only: new.read_only, root_squash: new.root_squash };
        self.0.add(caller, e).map(view).map_err(fail)
    }

    fn change(&self, caller: &Caller, id: &str, c: ExportChange) -> ExportResult<ExportView> {
        let patch = ExportPatch { clients: c.clients, read_only: c.read_only, root_squash: c.root_squash };
        self.0.update(caller, id, patch).map(view).map_err(fail)
    }

    fn remove(&self, caller: &Caller, id: &str) -> ExportResult<()> {
        self.0.remove(caller, id).map_err(fail)
    }
}
