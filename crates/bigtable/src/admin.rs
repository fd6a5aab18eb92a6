//! perc's table and its column families, made through the Bigtable table-admin API: the
//! table is created if missing, and families the schema declares but the table lacks are
//! added (an upgrade that adds a family needs nothing by hand). Nothing is ever dropped.

use std::collections::HashMap;

use googleapis_tonic_google_bigtable_admin_v2::google::bigtable::admin::v2::{
    bigtable_table_admin_client::BigtableTableAdminClient,
    modify_column_families_request::{modification::Mod, Modification},
    ColumnFamily, CreateTableRequest, GetTableRequest, ModifyColumnFamiliesRequest, Table,
};
use perc_store::Schema;
use tonic::service::Interceptor;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Code, Request, Status};

use crate::{BigtableConfig, Error};

const ADMIN_SCOPE: &str = "https://www.googleapis.com/auth/bigtable.admin.table";

/// Adds the OAuth bearer token to every admin call (none against the emulator).
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            req.metadata_mut().insert("authorization", token.clone());
        }
        Ok(req)
    }
}

/// Creates `config.table` with the schema's families, or adds the families it lacks. Whether
/// this call created the table.
pub async fn ensure_table(config: &BigtableConfig, schema: &Schema) -> Result<bool, Error> {
    let (channel, bearer) = match &config.emulator {
        Some(addr) => {
            let channel = Channel::from_shared(format!("http://{addr}"))
                .map_err(|e| Error::Config(format!("emulator address {addr:?}: {e}")))?
                .connect()
                .await
                .map_err(|e| {
                    Error::Unreachable(format!("cannot reach the emulator at {addr}: {e}"))
                })?;
            (channel, Bearer(None))
        }
        None => {
            let provider = gcp_auth::provider()
                .await
                .map_err(|e| Error::Config(format!("no Google Cloud credentials: {e}")))?;
            let token = provider
                .token(&[ADMIN_SCOPE])
                .await
                .map_err(|e| Error::Config(format!("cannot get an admin token: {e}")))?;
            let value = format!("Bearer {}", token.as_str())
                .parse()
                .map_err(|e| Error::Config(format!("malformed token: {e}")))?;
            let channel = Channel::from_static("https://bigtableadmin.googleapis.com")
                .tls_config(ClientTlsConfig::new().with_webpki_roots())
                .map_err(|e| Error::Rpc(e.to_string()))?
                .connect()
                .await
                .map_err(|e| Error::Unreachable(format!("cannot reach bigtableadmin: {e}")))?;
            (channel, Bearer(Some(value)))
        }
    };
    let mut admin = BigtableTableAdminClient::with_interceptor(channel, bearer);
    let parent = format!("projects/{}/instances/{}", config.project, config.instance);
    let name = format!("{parent}/tables/{}", config.table);
    let families: HashMap<String, ColumnFamily> =
        schema.families().iter().map(|f| (f.name.to_string(), ColumnFamily::default())).collect();
    let create = CreateTableRequest {
        parent: parent.clone(),
        table_id: config.table.clone(),
        table: Some(Table { column_families: families.clone(), ..Table::default() }),
        initial_splits: vec![],
    };
    match admin.create_table(create).await {
        Ok(_) => return Ok(true),
        Err(s) if s.code() == Code::AlreadyExists => {}
        Err(s) if s.code() == Code::Unavailable => {
            return Err(Error::Unreachable(format!("creating table {name}: {}", s.message())))
        }
        Err(s) => return Err(Error::Rpc(format!("creating table {name}: {}", s.message()))),
    }
    let existing = admin
        .get_table(GetTableRequest { name: name.clone(), view: 0 })
        .await
        .map_err(|s| Error::Rpc(format!("reading table {name}: {}", s.message())))?
        .into_inner();
    let missing: Vec<Modification> = families
        .into_iter()
        .filter(|(f, _)| !existing.column_families.contains_key(f))
        .map(|(id, cf)| Modification { id, update_mask: None, r#mod: Some(Mod::Create(cf)) })
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    tracing::info!(table = %name, families = missing.len(), "adding column families");
    admin
        .modify_column_families(ModifyColumnFamiliesRequest {
            name: name.clone(),
            modifications: missing,
            ignore_warnings: false,
        })
        .await
        .map_err(|s| Error::Rpc(format!("adding families to {name}: {}", s.message())))?;
    Ok(false)
}
